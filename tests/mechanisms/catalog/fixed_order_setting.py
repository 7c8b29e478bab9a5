"""The setting the correlated-noise mechanisms' tests share (`test_dp_bandmf.py`, `test_dpftrl_tree.py`,
`test_dpsgd_fixed_order.py`, `test_matrix_factorization.py`): digits' training split in fixed-order batches, so
that P = round(N / B) = 22 steps per epoch and one example joins one step per epoch."""

from __future__ import annotations

from mechanisms.parts.plan import PrivacySpec

N, B, EPOCHS, DELTA = 1437, 64, 6, 1e-5
P = round(N / B)


def spec(epsilon_target: float | None = None, sigma: float | None = None, **options) -> PrivacySpec:
    return PrivacySpec(epsilon=epsilon_target, delta=DELTA, dataset_size=N, batch_size=B, epochs=EPOCHS, clip=1.0,
                       sigma=sigma, options=options)
