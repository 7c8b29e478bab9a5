"""The PLD of one Poisson-subsampled Gaussian step, as dp-accounting builds it, with its losses inverted at once.

`dp_accounting.pld.privacy_loss_distribution.from_gaussian_mechanism` inverts the privacy loss one grid point
at a time in Python: 57,000 calls per adjacency at the quickstart's noise (sigma 0.53, q 0.0085) on a 2.7e-4
grid, 0.2 s of a 0.3 s epsilon, and most of what the audits' family bounds cost. `gaussian_pld` builds the same
discretisation (the same buckets, the same tails, dp-accounting's own pmf constructors and composition) with
the inverse evaluated on the whole grid in numpy. Only the order of floating-point operations differs, and
`tests/mechanisms/accounting/test_gaussian_pld.py` holds it equal to dp-accounting's on both algorithms,
both adjacencies and after composition.

Supported: add-or-remove adjacency, sensitivity 1 (the clip is folded into sigma), the pessimistic
connect-the-dots and the optimistic privacy-buckets algorithms; anything else raises rather than guesses.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

SPARSE_BUCKETS = 1000  # dp-accounting's `pld_pmf._MAX_PMF_SPARSE_SIZE`: at most this many buckets stay sparse


def gaussian_pld(sigma: float, sampling_prob: float, discretization: float, *, pessimistic: bool) -> Any:
    """`from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=h,
    pessimistic_estimate=p, use_connect_dots=p)`: connect-the-dots when pessimistic (every delta an upper
    bound), privacy buckets rounded down when not (every delta a lower bound). h is at least `grid_floor(sigma)`
    (the work a tiny sigma's loss range would otherwise take: minutes at sigma 0.017)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib  # lazy: heavy (dp_accounting)
    from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType  # lazy: heavy (dp_accounting)

    from mechanisms.accounting.adaptive_pld import grid_floor  # lazy: heavy (dp_accounting, scipy)

    if not (sigma > 0 and 0 < sampling_prob <= 1 and discretization > 0):
        raise ValueError(f"need sigma > 0, 0 < q <= 1 and a grid > 0, got {sigma}, {sampling_prob}, {discretization}")
    discretization = max(discretization, grid_floor(sigma))  # a tiny sigma's loss spans thousands of units
    build = _connect_dots if pessimistic else _optimistic_buckets
    remove = build(_loss(sigma, sampling_prob, AdjacencyType.REMOVE, pessimistic), discretization)
    if sampling_prob == 1.0:
        return pld_lib.PrivacyLossDistribution(remove)
    add = build(_loss(sigma, sampling_prob, AdjacencyType.ADD, pessimistic), discretization)
    return pld_lib.PrivacyLossDistribution(remove, add)


def _loss(sigma: float, q: float, adjacency: Any, pessimistic: bool) -> Any:
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss  # lazy: heavy (dp_accounting)

    return GaussianPrivacyLoss(sigma, sensitivity=1, pessimistic_estimate=pessimistic, sampling_prob=q,
                               adjacency_type=adjacency)


def inverse_privacy_loss(loss: Any, epsilons: np.ndarray) -> np.ndarray:
    """`loss.inverse_privacy_loss` on an array (sensitivity 1): the largest x whose privacy loss is at least
    each epsilon, by the same formulas (`common.log_a_times_exp_b_plus_c`, then the unsubsampled inverse).
    Epsilons outside the loss's range raise, as dp-accounting's do; the edge itself maps to +-inf."""
    from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType  # lazy: heavy (dp_accounting)

    eps = np.asarray(epsilons, dtype=np.float64)
    q, var = loss.sampling_prob, loss.standard_deviation ** 2
    add = loss.adjacency_type == AdjacencyType.ADD
    if loss.adjacency_type not in (AdjacencyType.ADD, AdjacencyType.REMOVE):
        raise ValueError(f"only add or remove adjacency is supported, got {loss.adjacency_type}")
    b = -eps if add else eps  # REMOVE: log(a e^b + c); ADD: its negative at -eps
    if q == 1.0:
        unsub = -b if add else b
        edge = np.zeros(eps.shape, dtype=bool)
    else:
        edge_value = -math.log(1 - q) if add else math.log(1 - q)
        edge = np.isclose(eps, edge_value, rtol=1e-9, atol=0.0)
        if np.any(((eps > edge_value) if add else (eps < edge_value)) & ~edge):
            raise ValueError("privacy loss outside the subsampled Gaussian's range")
        a, c = 1 / q, 1 - 1 / q
        d = b + np.log(a)
        with np.errstate(invalid="ignore", divide="ignore"):
            logged = d + np.log1p(-np.exp(np.log(-c) - d))  # common._log_sub(d, log(-c))
        logged = np.where(b == 0, np.log(a + c), logged)
        unsub = -logged if add else logged
    x = -0.5 - unsub * var  # the unsubsampled inverse for REMOVE; ADD adds the sensitivity
    if add:
        x = 1.0 + x
    return np.where(edge, -np.inf if add else np.inf, x)


def _deltas(loss: Any, epsilons: np.ndarray) -> np.ndarray:
    """`loss.get_delta_for_epsilon` on an array, with the inverse evaluated at once."""
    from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType  # lazy: heavy (dp_accounting)

    eps = np.asarray(epsilons, dtype=np.float64)
    deltas = np.zeros_like(eps)
    q = loss.sampling_prob
    if q == 1.0:
        inside = np.ones(eps.shape, dtype=bool)
    elif loss.adjacency_type == AdjacencyType.ADD:
        inside = eps < -math.log1p(-q)
    else:
        inside = eps > math.log1p(-q)
        deltas[~inside] = -np.expm1(eps[~inside])
    x = inverse_privacy_loss(loss, eps[inside])
    deltas[inside] = loss.mu_upper_cdf(x) - np.exp(eps[inside] + loss.mu_lower_log_cdf(x))
    return np.clip(deltas, 0, 1)


def _connect_dots(loss: Any, h: float) -> Any:
    """`_create_pld_pmf_from_monotone_privacy_loss(..., use_connect_dots=True)`, continuous branch."""
    from dp_accounting.pld import pld_pmf  # lazy: heavy (dp_accounting)

    bounds = loss.connect_dots_bounds()
    upper, lower = math.ceil(bounds.epsilon_upper / h), math.floor(bounds.epsilon_lower / h)
    deltas = _deltas(loss, np.arange(lower, upper + 1) * h)
    return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(h, lower, upper, deltas)


def _optimistic_buckets(loss: Any, h: float) -> Any:
    """`_create_pld_pmf_from_monotone_privacy_loss(..., pessimistic_estimate=False)`, continuous branch: each
    interval of x between the inverses of consecutive grid losses goes to the lower end of its losses."""
    from dp_accounting.pld import pld_pmf  # lazy: heavy (dp_accounting)

    tail = loss.privacy_loss_tail()
    lower_x, upper_x = tail.lower_x_truncation, tail.upper_x_truncation
    tails = [(math.floor(value / h), mass) for value, mass in tail.tail_probability_mass_function.items()
             if value != math.inf]
    infinity_mass = float(tail.tail_probability_mass_function.get(math.inf, 0.0))
    upper_loss = loss.privacy_loss(upper_x)
    # dp-accounting walks the grid losses down from the loss at lower_x, cutting x at each one's inverse, until
    # one is at or below the loss at upper_x (that interval ends at upper_x) or a cut reaches upper_x
    rounded = np.arange(math.floor(loss.privacy_loss(lower_x) / h), math.floor(upper_loss / h) - 2, -1)
    last = int(np.flatnonzero(rounded * h <= upper_loss)[0])
    rounded = rounded[: last + 1]
    cuts = np.append(inverse_privacy_loss(loss, rounded[:last] * h), upper_x)
    stop = int(np.flatnonzero(cuts >= upper_x)[0]) + 1
    cuts, rounded = cuts[:stop], rounded[:stop]
    masses = np.diff(loss.mu_upper_cdf(np.concatenate([[lower_x], cuts])))
    # dp-accounting sums the tails and then the intervals into a dict keyed by bucket and hands it to
    # `create_pmf`, which keeps up to 1,000 buckets sparse and lays more out densely from the lowest
    keys = {*rounded.tolist(), *(k for k, _ in tails)}
    if len(keys) <= SPARSE_BUCKETS:
        pmf: dict[int, float] = {}
        for key, mass in [*tails, *zip(rounded.tolist(), masses.tolist(), strict=True)]:
            pmf[key] = pmf.get(key, 0.0) + mass
        return pld_pmf.create_pmf(pmf, h, infinity_mass, pessimistic_estimate=False)
    low = min(keys)
    probs = np.zeros(max(keys) - low + 1)
    for key, mass in tails:
        probs[key - low] += mass
    probs[rounded - low] += masses  # distinct buckets, each added after its tail mass as in the dict
    return pld_pmf.DensePLDPmf(h, low, probs, infinity_mass, pessimistic_estimate=False)


def hockey_stick(pld: Any, epsilons: np.ndarray) -> np.ndarray:
    """`pld.get_delta_for_epsilon(epsilons)` (ascending epsilons) for a PLD of dense pmfs, in numpy.

    dp-accounting walks a composed pmf's losses one at a time in Python: 0.05-0.09 s per privacy profile at
    the quickstart's 585 steps, for each noise multiplier the curve search tries. This is the same sum,
    delta(eps) = inf_mass + sum over losses l > eps of p_l (1 - e^(eps - l)), with suffix sums. It reads the
    pmfs' arrays, which dp-accounting keeps private; where they are not there (another layout in another
    version) it asks dp-accounting instead, so a change there costs time, never a wrong delta.
    """
    eps = np.asarray(epsilons, dtype=np.float64)
    arrays = _pld_arrays(pld)
    if arrays is None or np.any(np.diff(eps) < 0):
        return np.asarray(pld.get_delta_for_epsilon(eps), dtype=np.float64)
    deltas = [_dense_hockey_stick(*a, eps) for a in arrays]
    return np.maximum.reduce(deltas) if len(deltas) > 1 else deltas[0]


def _pld_arrays(pld: Any) -> list[tuple[np.ndarray, np.ndarray, float]] | None:
    """The arrays of a PLD's pmfs (remove, and add unless symmetric), or None where any layout is unknown."""
    pmfs = [getattr(pld, "_pmf_remove", None)]
    if not getattr(pld, "_symmetric", True):
        pmfs.append(getattr(pld, "_pmf_add", None))
    arrays = [_dense_arrays(p) for p in pmfs]
    return None if any(a is None for a in arrays) else arrays


def _dense_arrays(pmf: Any) -> tuple[np.ndarray, np.ndarray, float] | None:
    """(losses, probabilities, infinity mass) of a pmf, or None where its layout is not the one known."""
    dense = pmf.to_dense_pmf() if hasattr(pmf, "to_dense_pmf") else None
    probs, lower = getattr(dense, "_probs", None), getattr(dense, "_lower_loss", None)
    h, inf = getattr(dense, "_discretization", None), getattr(dense, "_infinity_mass", None)
    if not isinstance(probs, np.ndarray) or None in (lower, h, inf):
        return None
    return (np.arange(probs.size) + lower) * h, probs, float(inf)


def _dense_hockey_stick(losses: np.ndarray, probs: np.ndarray, infinity_mass: float, eps: np.ndarray) -> np.ndarray:
    above = np.searchsorted(losses, eps, side="right")  # the losses strictly above each epsilon start here
    upper = np.concatenate([np.cumsum(probs[::-1])[::-1], [0.0]])
    # e^-loss overflows for very negative losses (a tiny sigma): only suffix sums starting there, which no
    # epsilon >= the smallest loss reads, become inf or nan
    with np.errstate(over="ignore", invalid="ignore"):
        lower = np.concatenate([np.cumsum((probs * np.exp(-losses))[::-1])[::-1], [0.0]])
        deltas = infinity_mass + upper[above] - np.exp(eps) * lower[above]
    return np.where(np.isposinf(eps), infinity_mass, deltas)


def epsilon_for_delta(pld: Any, delta: float) -> float:
    """`pld.get_epsilon_for_delta(delta)` for a PLD of dense pmfs, in numpy (dp-accounting walks the losses
    above the answer one at a time in Python). The same walk down the losses, its running sums taken at once;
    where the pmfs' layout is not the one known it asks dp-accounting, as `hockey_stick` does."""
    arrays = _pld_arrays(pld)
    if arrays is None:
        return float(pld.get_epsilon_for_delta(delta))
    return max(_dense_epsilon(*a, float(delta)) for a in arrays)


def _dense_epsilon(losses: np.ndarray, probs: np.ndarray, infinity_mass: float, delta: float) -> float:
    """dp-accounting's `_get_epsilon_for_delta`: before taking loss k (from the top) the sums are upper[k] (mass
    at or above it, the infinite loss included) and lower[k] (that mass weighted by e^-loss); the walk stops at
    the first k whose loss the current epsilon, log((upper - delta) / lower), already reaches."""
    if infinity_mass > delta:
        return math.inf
    down, p = losses[::-1], probs[::-1]
    upper = np.concatenate([[infinity_mass], infinity_mass + np.cumsum(p)])  # np.cumsum adds in order
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # an overflow is an infinite epsilon
        lower = np.concatenate([[0.0], np.cumsum(np.exp(-down) * p)])
        reached = (upper[:-1] > delta) & (lower[:-1] > 0) & (np.log((upper[:-1] - delta) / lower[:-1]) >= down)
    unseen = (upper[1:] >= delta) & (lower[1:] == 0)  # losses so large that e^-loss is 0: the loss itself
    stop, top = np.flatnonzero(reached), np.flatnonzero(unseen)
    if top.size and (not stop.size or top[0] < stop[0]):
        return max(0.0, float(down[top[0]]))
    k = int(stop[0]) if stop.size else down.size
    if upper[k] <= lower[k] + delta:
        return 0.0
    return math.log((upper[k] - delta) / lower[k])
