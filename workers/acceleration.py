"""Mixed precision and the compiled step: what `train: {precision, compile}` changes in a training step.

Precision (`fp32`, the default; `bf16`; `fp16`) runs the forward pass and the loss under `torch.autocast`.
Private training needs the book-keeping engine (`grad_sample_mode: bk`) for a narrow precision: the engine
computes every per-sample norm and clipping factor in fp32 from the bf16 / fp16 activations and output
gradients (mechanisms/clipping_engine/norms.py), while Opacus' modes would compute them in the narrow dtype.
Parameters, their gradients, the noise and the optimizer stay fp32.

- `bf16`: CUDA and CPU (CPU autocast supports bf16). bf16 has fp32's exponent range, so no loss scaling.
- `fp16`: CUDA only. Non-private training uses `torch.amp.GradScaler` (fp16 gradients underflow without a
  loss scale). Private training refuses it: a dynamic loss scale skips the update when some example's
  gradient overflows and lowers the scale after it, so whether a step happens, and the next steps' scale,
  depend on the private batch without noise, which no accountant covers. Use bf16.

`compile: true` wraps the module in `torch.compile` (TorchDynamo + Inductor). It is sound for non-private
training and for `bk`: Dynamo keeps Python semantics (the engine's autograd Functions report to their Tap
in eager code, graph breaks where needed), so the clipped sums are those of the eager step (tested). Opacus'
modes are refused: their hooks read module state that compiled regions may not run.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from workers.config import COMPILABLE_MODES, PRECISIONS, step_problems

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_settings(precision: str, compile_step: bool, grad_sample_mode: str | None) -> None:
    """What can be refused before anything runs (the device and the mechanism are checked in `prepare`)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if problems := step_problems(precision, compile_step, grad_sample_mode):
        raise ValueError("; ".join(problems))


class StepPrecision:
    """The autocast context and, for fp16 without privacy on CUDA, the gradient scaler of one trial."""

    def __init__(self, precision: str, device: torch.device, *, private: bool, grad_sample_mode: str | None) -> None:
        check_settings(precision, False, grad_sample_mode if private else None)
        device = torch.device(device)
        if precision == "fp16" and device.type != "cuda":
            raise ValueError("precision fp16 needs CUDA (CPU autocast runs bf16); use bf16 or fp32 on CPU")
        if precision == "fp16" and private:
            raise ValueError("precision fp16 is refused for private training: its dynamic loss scale skips "
                             "updates depending on the private batch; use bf16")
        self.name, self.device = precision, device
        self.dtype = DTYPES.get(precision)
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward_and_step(self, loss: Any, optimizer: torch.optim.Optimizer) -> None:
        """`loss.backward(); optimizer.step()`, through the gradient scaler when there is one."""
        if self.scaler is None:
            loss.backward()
            optimizer.step()
            return
        self.scaler.scale(loss).backward()
        self.scaler.step(optimizer)
        self.scaler.update()


def compiled(module: torch.nn.Module, grad_sample_mode: str | None, private: bool) -> torch.nn.Module:
    """`torch.compile(module)` where the compiled step is sound (see the module docstring), else refused."""
    if private and grad_sample_mode not in COMPILABLE_MODES:
        raise ValueError(f"compile: true supports grad_sample_mode bk only, got {grad_sample_mode}")
    if not torch._dynamo.is_dynamo_supported():
        raise ValueError("compile: true is not available here (torch.compile is unsupported on this Python or "
                         "platform); set compile: false")
    return torch.compile(module)  # type: ignore[return-value]
