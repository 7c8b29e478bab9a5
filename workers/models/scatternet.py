"""ScatterNet models (Tramèr & Boneh, ICLR 2021): a fixed scattering transform, a normalisation, a head.

The scattering transform (kymatio's `Scattering2D`, J=2 scales, L=8 angles, order 2: 81 channels per image
channel at a quarter of the resolution, 81x7x7 on 28x28) has no trainable parameters and looks at one
image at a time, so it is part of `encode`, not of the trained module: it is computed once per split and
kept on disk (`cache_dir()`), and training clips and noises only the head's gradients. Computing it on the
training images releases nothing by itself; what would is a statistic over them, such as the
standardisation below.

Normalisations of the features: `group` (GroupNorm without affine parameters, per example, so it costs no
privacy; 27 groups of 3 channels as in the paper's code), `none`, or `private`: the paper's MNIST
ScatterNet+linear standardises each channel with a mean and variance computed privately over the training
set. Here that is a declared statistic (`workers.models.contract.Statistic`): each example's channel means
and channel mean squares (`channel_moments`), clipped to `norm_bounds` and noised at multiplier `norm_noise_multiplier`
(8 in the paper) by privbench's `DatasetStatistic`, released once before training and composed with DP-SGD
in the plan (certified and claimed alike); `Standardize` applies the released values.

The paper's code clips at the median of the examples' norms, computed without noise (its comment admits the
leak); privbench's bounds are fixed numbers that read no data. The defaults, 0.3 and 0.15, are round values
near Fashion-MNIST's medians (0.30 and 0.15), and above MNIST's (0.18 and 0.05, so MNIST's statistics are
clipped less and noised more than in the paper: the noise on a channel mean is 0.3 x 8 / 60,000 = 4e-5).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D
from torch import nn

from mechanisms.parts.releases import DatasetStatistic
from workers.datasets.contract import PublicSplits, Split
from workers.models.contract import ModelBundle, Statistic
from workers.models.vision import GRAD_SAMPLE_MODE, flat_size

J, L, ORDER = 2, 8, 2  # the paper's transform: 1 + J L + L^2 J (J - 1) / 2 = 81 channels per input channel
CHANNELS = 1 + J * L + L * L * J * (J - 1) // 2
CACHE_FORMAT = 1  # bump when what a cached file holds changes, so older files are never read again
CHUNK = 256  # images per call of the transform (its working set, ~40 MB at 28x28, stays in cache)


def cache_dir() -> Path:
    """Where scattering features are kept: `$PRIVBENCH_CACHE_DIR/scattering`, else
    `$XDG_CACHE_HOME/privbench/scattering`, else `~/.cache/privbench/scattering`."""
    root = os.environ.get("PRIVBENCH_CACHE_DIR")
    if not root:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "privbench")
    return Path(root) / "scattering"


def feature_key(images: np.ndarray) -> str:
    """Everything the features depend on: the images' bytes, shape and dtype, the transform's parameters,
    and the kymatio and torch versions that compute it (a new version may round differently)."""
    images = np.ascontiguousarray(images)
    meta = {"format": CACHE_FORMAT, "J": J, "L": L, "order": ORDER, "shape": list(images.shape),
            "dtype": images.dtype.str, "kymatio": importlib.metadata.version("kymatio"),
            "torch": torch.__version__.split("+")[0]}
    digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    digest.update(memoryview(images).cast("B"))
    return digest.hexdigest()[:40]


def feature_shape(images_shape: tuple[int, ...]) -> tuple[int, ...]:
    n, c, h, w = images_shape
    return (n, c * CHANNELS, -(-h // 2**J), -(-w // 2**J))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created if needed): one process computes a key, the others wait for it."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read(path: Path, shape: tuple[int, ...]) -> np.ndarray | None:
    """The cached features, or None when there are none that fit (a file that does not load or has another
    shape is not trusted: it is recomputed and replaced)."""
    try:
        features = np.load(path)
    except (OSError, ValueError, EOFError):
        return None
    return features if features.shape == shape and features.dtype == np.float32 else None


def _transform(images: np.ndarray) -> np.ndarray:
    # the 2-D frontend itself: `kymatio.torch` also loads the 3-D transform, which imports
    # scipy.special.sph_harm (removed in SciPy 1.17)

    n, _c, h, w = images.shape
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    scattering = ScatteringTorch2D(J=J, shape=(h, w), L=L, max_order=ORDER).to(device)
    out = np.empty(feature_shape(images.shape), dtype=np.float32)
    with torch.no_grad():
        for start in range(0, n, CHUNK):
            batch = torch.from_numpy(np.ascontiguousarray(images[start:start + CHUNK], dtype=np.float32))
            part = scattering(batch.to(device))  # (B, C, 81, h', w')
            out[start:start + CHUNK] = part.reshape(len(batch), *out.shape[1:]).cpu().numpy()
    return out


def scattering_features(images: np.ndarray) -> np.ndarray:
    """The scattering transform of float32 images (N, C, H, W) -> (N, 81 C, H/4, W/4), from the disk cache.

    Concurrent trials on one machine are safe: the file of a key is written whole under a temporary name
    and renamed into place (readers see it complete or not at all), and a per-key lock makes the others
    wait for the one computing it instead of computing it again. The key covers everything the values
    depend on (`feature_key`), so a cached file can never be stale."""
    shape = feature_shape(images.shape)
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    key = feature_key(images)
    path = folder / f"{key}.npy"
    if (cached := _read(path, shape)) is not None:
        return cached
    with _locked(folder / f"{key}.lock"):
        if (cached := _read(path, shape)) is not None:  # computed by another trial while this one waited
            return cached
        features = _transform(images)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{key}.", suffix=".tmp", delete=False) as tmp:
            try:
                np.save(tmp, features)
                tmp.flush()
                os.fsync(tmp.fileno())
            except BaseException:
                os.unlink(tmp.name)  # a disk that filled up leaves no partial file behind
                raise
        os.chmod(tmp.name, 0o644)  # as a plain file would be (a temporary file is private to its owner)
        os.replace(tmp.name, path)
    return features


def encode(split: Split) -> tuple[torch.Tensor, ...]:
    return (torch.from_numpy(scattering_features(split.inputs)),)


class Standardize(nn.Module):
    """Per-channel standardisation with given statistics (as the paper's private batch-norm: channels whose
    released variance is 0 are zeroed). `set_statistics` fills it; until then it refuses to run, so a
    model whose statistics were never released cannot train as if it had them."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(channels))
        self.register_buffer("var", torch.ones(channels))
        self.ready = False

    def set_statistics(self, mean: torch.Tensor, var: torch.Tensor) -> None:
        self.mean.copy_(mean)
        self.var.copy_(var.clamp(min=0))
        self.ready = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.ready:
            raise RuntimeError("Standardize: no statistics were released (set_statistics was never called)")
        view = (1, -1) + (1,) * (x.dim() - 2)
        return (x - self.mean.view(view)) / torch.sqrt(self.var.view(view) + 1e-5) * (self.var.view(view) != 0)


def channel_moments(features: torch.Tensor) -> torch.Tensor:
    """Per-example (N, 2, K) channel means of the features and of their squares: what a private
    standardisation clips per example and sums (its sensitivity is the clip bound of each row)."""
    flat = features.reshape(features.shape[0], features.shape[1], -1)
    return torch.stack([flat.mean(-1), (flat**2).mean(-1)], 1)


def _head(kind: str, shape: tuple[int, ...], classes: int) -> nn.Module:
    """`linear`: one linear layer on the flattened features. `cnn`: the paper's CNN on scattering features,
    conv 16 3x3 stride 2 padding 1, tanh, conv 32 3x3 padding 1, tanh, linear 32, tanh, linear."""
    if kind == "linear":
        return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(shape)), classes))
    convs = nn.Sequential(nn.Conv2d(shape[0], 16, 3, stride=2, padding=1), nn.Tanh(),
                          nn.Conv2d(16, 32, 3, stride=1, padding=1), nn.Tanh(), nn.Flatten())
    return nn.Sequential(*convs, nn.Linear(flat_size(convs, shape), 32), nn.Tanh(), nn.Linear(32, classes))


Norm = Literal["group", "none", "private"]


def standardisation(standardize: Standardize, bounds: tuple[float, float], noise: float) -> Statistic:
    """The private standardisation's statistic: channel means and mean squares, released once; the variance
    is derived from the released values (post-processing), clamped at 0."""
    def receive(sums: torch.Tensor, n: int) -> None:
        mean, square = sums[0] / n, sums[1] / n
        standardize.set_statistics(mean.float(), (square - mean**2).float())

    return Statistic(DatasetStatistic("channel_moments", bounds, noise), lambda xs: channel_moments(xs[0]), receive)


def scatternet(splits: PublicSplits, head: Literal["linear", "cnn"], norm: Norm = "group", groups: int = 27,
               norm_noise_multiplier: float = 8.0, norm_bounds: tuple[float, float] = (0.3, 0.15)) -> ModelBundle:
    _, *shape = feature_shape((1, *splits.input_shape))
    if norm == "group" and shape[0] % groups:
        raise ValueError(f"groups must divide the {shape[0]} scattering channels, got {groups}")
    statistics: tuple[Statistic, ...] = ()
    layers: list[nn.Module] = []
    if norm == "group":
        layers = [nn.GroupNorm(groups, shape[0], affine=False)]
    elif norm == "private":
        standardize = Standardize(shape[0])
        layers = [standardize]
        bounds = (float(norm_bounds[0]), float(norm_bounds[1]))
        statistics = (standardisation(standardize, bounds, norm_noise_multiplier),)
    module = nn.Sequential(*layers, *_head(head, tuple(shape), splits.num_classes))
    return ModelBundle(module, encode, {"grad_sample_mode": GRAD_SAMPLE_MODE, "feature_shape": tuple(shape)},
                       statistics)


def scatternet_linear(splits: PublicSplits, norm: Norm = "group", groups: int = 27, norm_noise_multiplier: float = 8.0,
                      norm_bounds: tuple[float, float] = (0.3, 0.15)) -> ModelBundle:
    return scatternet(splits, "linear", norm, groups, norm_noise_multiplier, norm_bounds)


def scatternet_cnn(splits: PublicSplits, norm: Norm = "group", groups: int = 27, norm_noise_multiplier: float = 8.0,
                   norm_bounds: tuple[float, float] = (0.3, 0.15)) -> ModelBundle:
    return scatternet(splits, "cnn", norm, groups, norm_noise_multiplier, norm_bounds)
