"""Neighbouring-data checks of everything that runs before training.

DP-SGD's guarantee covers what the accountant counts: the noised releases of the steps and of the declared
statistics. Whatever is computed before training (the plan and its claim, the model's initial state, the rows
the dataset makes of its records, what the builder writes into the record) must come out the same on any two
neighbouring training sets, or it carries private data past the mechanism, where no accountant sees it.

So privbench checks it from the outside, whatever the plugin: the plan phase runs the plan-time code (the
dataset's per-record transform, the model builder under the trial's seed, the mechanism's whole `plan_for`)
again on a neighbour D' of the trial's training set D, and compares (`check`). D' has one training record
replaced by one of another class from outside the training split (`workers.datasets.contract.replace_record`):
N is kept, so the geometry and the plan's legitimate inputs stay equal, and the class counts and the means
change. Plugin code that loads a dataset through `workers.datasets.load` gets D' during the rerun.

A loader without a per-record transform (opaque) cannot be handed a neighbour. Its trial is not certified and
the record says that its rows were not checked; its rows are still measured (`measured`: copies and one-pixel
shifts among the training rows, a standardisation fitted on the training split), as every dataset's are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from mechanisms.framework.integrity import Finding
from workers.datasets.contract import Split, neighbouring

# rows that are copies or one-pixel shifts of another record's rows: a share above this is several rows per record
DUPLICATE_SHARE = 0.01
PAIRED_SAMPLE = 4096  # rows looked up among all the others for a copy or a shift (the share's estimate)
# a mean this close to 0 and a standard deviation this close to 1 (per feature, per channel or overall) is a
# standardisation fitted on the training split itself, not a fixed scaling
STANDARD_TOLERANCE = 1e-3
PLAIN = (str, int, float, bool, type(None))


@dataclasses.dataclass(frozen=True)
class Pretraining:
    """What the plan-time code made of one training set: the plan (`planned`), its spec and a tuned candidate's
    fields, and the views of everything that may not depend on the training set: the plan's record (the claim and
    its extras included) with the tuned fields, the spec's fields, the model's initial state (name -> (what it
    is, tensor)), the builder's plain info (what the record shows of it), and the training rows."""

    planned: Any  # the PrivacyPlan
    spec: Any  # the PrivacySpec
    tuning: Mapping[str, Any]
    plan: Mapping[str, Any]
    spec_fields: Mapping[str, Any]
    state: Mapping[str, tuple[str, torch.Tensor]]
    info: Mapping[str, Any]
    rows: Split

    @classmethod
    def of(cls, plan: Any, tuning: Mapping[str, Any], spec: Any, module: torch.nn.Module, info: Mapping[str, Any],
           rows: Split) -> Pretraining:
        return cls(plan, spec, tuning, plan.as_record() | {"tuning": dict(tuning)},
                   {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}, model_state(module),
                   {k: v for k, v in info.items() if _plain(v)}, rows)


def model_state(module: torch.nn.Module) -> dict[str, tuple[str, torch.Tensor]]:
    """Every tensor of the model: parameters, buffers (persistent or not) and plain tensor attributes."""
    state = {name: ("parameter", p.detach()) for name, p in module.named_parameters()}
    state |= {name: ("buffer", b.detach()) for name, b in module.named_buffers()}
    for prefix, sub in module.named_modules():
        for attr, value in vars(sub).items():
            if isinstance(value, torch.Tensor):
                state.setdefault(f"{prefix}.{attr}" if prefix else attr, ("tensor attribute", value.detach()))
    return state


def check(dataset: str, trial: Pretraining, rerun: Callable[[], Pretraining], index: Callable[[int], int],
          transformed: bool) -> tuple[Finding, ...]:
    """The findings of the neighbouring-data checks: `rerun()` is the plan-time code run again, here on the
    neighbour whose training record `index(N)` is replaced; `transformed`: the dataset has a per-record transform
    (its rows can be checked)."""
    with neighbouring(index):
        other = rerun()
    replaced = index(len(trial.rows))
    return (_plan_finding(trial, other), _model_finding(trial, other),
            _rows_finding(dataset, trial.rows, other.rows, replaced, transformed),
            _measured_finding(dataset, trial.rows))


def _plan_finding(a: Pretraining, b: Pretraining) -> Finding:
    where = first_difference(a.plan, b.plan)
    if where is not None:
        return Finding("neighbour_plan", False, f"the plan's `{where}` depends on the training set")
    where = first_difference(a.spec_fields, b.spec_fields)
    if where is not None:
        return Finding("neighbour_plan", False, f"the privacy spec's `{where}` depends on the training set")
    return Finding("neighbour_plan", True)


def _model_finding(a: Pretraining, b: Pretraining) -> Finding:
    for name in sorted(set(a.state) ^ set(b.state)):
        kind = (a.state.get(name) or b.state[name])[0]
        return Finding("neighbour_model", False, f"the model's {kind} `{name}` exists on some training sets "
                                                 "only: the model's structure depends on the training set")
    for name, (kind, tensor) in a.state.items():
        if not _same_tensor(tensor, b.state[name][1]):
            return Finding("neighbour_model", False, f"the model's {kind} `{name}` depends on the training set")
    where = first_difference(a.info, b.info)
    if where is not None:
        return Finding("neighbour_model", False, f"the model builder's info `{where}` depends on the training set")
    return Finding("neighbour_model", True)


def _rows_finding(dataset: str, a: Split, b: Split, replaced: int, transformed: bool) -> Finding:
    if not transformed:
        return Finding("neighbour_rows", False, f"the dataset `{dataset}` has no per-record transform (its loader "
                                                "makes the rows itself): its training rows were not checked "
                                                "against a neighbouring training set")
    changed = changed_rows(a, b)
    if changed is None:
        return Finding("neighbour_rows", False, f"the number or shape of the dataset `{dataset}`'s training rows "
                                                "depends on the training set")
    units = getattr(a, "units", None)
    owned = np.flatnonzero(np.asarray(units) == units[replaced]) if units is not None else np.array([replaced])
    others = np.setdiff1d(changed, owned)
    if len(others):
        return Finding("neighbour_rows", False, f"the dataset `{dataset}`'s rows depend on other records: "
                                                f"replacing training record {replaced} changed {len(others)} other "
                                                f"rows (row {int(others[0])} first)")
    return Finding("neighbour_rows", True)


def _measured_finding(dataset: str, rows: Split) -> Finding:
    problems = measured(rows)
    if problems:
        return Finding("row_measures", False, f"the dataset `{dataset}`'s training rows: " + "; ".join(problems))
    return Finding("row_measures", True)


# ---- comparisons -------------------------------------------------------------------------------------------
def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The path (`extra.counts`, `parts.clip_bound`) of the first value that differs between two records of
    nested mappings, or None: equal (NaN equals NaN; sequences, arrays and tensors by value)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return _join(path, key)
            if (where := first_difference(a[key], b[key], _join(path, key))) is not None:
                return where
        return None
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        same = len(a) == len(b) and all(first_difference(x, y) is None for x, y in zip(a, b, strict=True))
        return None if same else (path or "value")
    return None if _same_value(a, b) else (path or "value")


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _array(value: Any) -> bool:
    return isinstance(value, np.ndarray | torch.Tensor)


def _same_value(a: Any, b: Any) -> bool:
    if _array(a) or _array(b):
        x, y = (np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v) for v in (a, b))
        return x.shape == y.shape and x.dtype == y.dtype and _same_array(x, y)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that cannot say whether they are equal are not known to be
        return False


def _same_array(x: np.ndarray, y: np.ndarray) -> bool:
    if np.issubdtype(x.dtype, np.inexact):
        return bool(np.array_equal(x, y, equal_nan=True))
    return bool(np.array_equal(x, y))


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a, b) or ((a == b) | (a.isnan() & b.isnan())).all())
    return bool(torch.equal(a, b))


def _plain(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return isinstance(value, PLAIN)


def changed_rows(a: Split, b: Split) -> np.ndarray | None:
    """The indices of the rows (input or label) that differ between two splits of the same size; None when
    their sizes or row shapes differ."""
    if len(a) != len(b):
        return None
    labels = np.asarray(a.labels) != np.asarray(b.labels)
    if isinstance(a.inputs, np.ndarray) and isinstance(b.inputs, np.ndarray):
        if a.inputs.shape != b.inputs.shape:
            return None
        differ = a.inputs != b.inputs
        if np.issubdtype(a.inputs.dtype, np.inexact):
            differ &= ~(np.isnan(a.inputs) & np.isnan(b.inputs))
        inputs = differ.reshape(len(a), -1).any(1)
    else:
        inputs = np.array([not _same_value(x, y) for x, y in zip(a.inputs, b.inputs, strict=True)], dtype=bool)
    return np.flatnonzero(labels | inputs)


# ---- what an opaque loader's rows show ---------------------------------------------------------------------
def measured(rows: Split) -> list[str]:
    """What the training rows show of pipelines that make rows from several records or several rows from one:
    images that are copies or one-pixel shifts of another record's (a declared unit's own rows excepted), and a
    standardisation fitted on the training split. Empty: nothing seen (texts are not measured)."""
    x = rows.inputs
    if not isinstance(x, np.ndarray) or not np.issubdtype(x.dtype, np.number) or len(x) < 2:
        return []
    units = getattr(rows, "units", None)
    units = np.asarray(units) if units is not None else np.arange(len(x))
    problems = []
    if x.ndim == 4 and min(x.shape[2:]) >= 4:  # images (N, C, H, W); tabular records often coincide by nature
        flat = x.reshape(len(x), -1)
        copies = _paired(flat, flat, units)
        if copies > DUPLICATE_SHARE:
            problems.append(f"{copies:.0%} of the rows are exact copies of another record's row (one record in "
                            "several rows: declare units, or use augmentation with multiplicity)")
        shifted = max(_paired(x[:, :, :-1], x[:, :, 1:], units), _paired(x[..., :-1], x[..., 1:], units))
        if shifted > DUPLICATE_SHARE:
            problems.append(f"{shifted:.0%} of the rows are one-pixel shifts of another record's row (one record in "
                            "several rows: declare units, or use augmentation with multiplicity)")
    problems += _standardised(x.reshape(len(x), x.shape[1], -1) if x.ndim == 4 else x.reshape(len(x), 1, -1))
    return problems


def _paired(first: np.ndarray, second: np.ndarray, units: np.ndarray) -> float:
    """The share of rows j (of `PAIRED_SAMPLE` drawn, or all) whose `second[j]` equals `first[i]` for a row i of
    another unit, rows compared by their bytes: `first` and `second` are two crops of the rows (the same crop:
    copies; the rows without their last line and without their first: one-pixel shifts)."""
    seen: dict[bytes, set[Any]] = {}
    for i, part in enumerate(np.ascontiguousarray(first).reshape(len(first), -1)):
        seen.setdefault(part.tobytes(), set()).add(units[i])
    drawn = np.random.default_rng(0).permutation(len(second))[:PAIRED_SAMPLE]
    count = 0
    for j in drawn:
        owners = seen.get(np.ascontiguousarray(second[j]).tobytes())
        count += bool(owners) and bool(owners - {units[j]})
    return count / len(drawn)


def _standardised(x: np.ndarray) -> list[str]:
    """A standardisation fitted on these rows: mean 0 and standard deviation 1 (to `STANDARD_TOLERANCE`, or 1/N
    for few rows) overall, per channel, or per varying feature. x: (N, channels, features per channel)."""
    tolerance = max(STANDARD_TOLERANCE, 1 / len(x))
    for level, data, axis in (("overall", x, None), ("per channel", x, (0, 2)),
                              ("per feature", x.reshape(len(x), -1), 0)):
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.atleast_1d(data.mean(axis=axis, dtype=np.float64))
            centred = np.abs(means) < tolerance  # NaN (a constant feature divided by its 0 std) is not centred
            if centred.sum() < 0.5 * np.isfinite(means).sum():  # most features are not centred: no std to compute
                continue
            stds = np.atleast_1d(data.std(axis=axis, dtype=np.float64))
        varying = np.isfinite(means) & np.isfinite(stds) & (stds > 0)
        if varying.any() and np.all(centred[varying]) and np.all(np.abs(stds[varying] - 1) < tolerance):
            return [f"their mean is 0 and their standard deviation 1 {level}, to {tolerance:g}: a standardisation "
                    "fitted on the training split (use a fixed scaling, or a private standardisation through a "
                    "Statistic)"]
    return []


__all__ = ["Pretraining", "changed_rows", "check", "first_difference", "measured", "model_state"]
