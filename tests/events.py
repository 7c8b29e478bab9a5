"""DP-SGD events for tests, built the way trial plans and `privbench privacy` build them: a sampler
(`mechanisms.parts.batch_selection`) and DP-SGD's parts (`DpsgdSetting.parts`)."""

from mechanisms.accounting.compare import DpsgdSetting
from mechanisms.parts.plan import Parts


def poisson_events(sample_rate: float, steps: int) -> Parts:
    """The event family sigma -> DpEvent of T Poisson-sampled DP-SGD steps at rate q (hashable)."""
    return DpsgdSetting.poisson(sample_rate, steps, 0.5).parts()


def poisson_event(sigma: float, sample_rate: float, steps: int):
    return poisson_events(sample_rate, steps).dp_event(sigma)


# Anchor settings (sigma, sample rate, steps) with published epsilons, shared by the accountants' tests
MNIST = (1.1, 256 / 60000, 14063)
CIFAR = (3.0, 4096 / 50000, 2500)
SST2 = (0.8, 1024 / 67349, 198)
LONG = (0.6, 256 / 50000, 19532)
