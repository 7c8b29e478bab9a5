"""DP-FTRL with tree aggregation (Kairouz, McMahan, Song, Thakkar, Thakurta, Xu, ICML 2021, arXiv 2103.00039):
correlated noise from a binary tree over each epoch's steps, restarted every epoch, on fixed-order batches.

What runs: one permutation of the training set fixed before training (`fixed-order`), cut into P = round(N / B)
batches visited in the same order every epoch; per-example clipping at C; the gradient sum of step t gets the
noise s (N_t - N_{t-1}), N_t the tree's prefix-sum noise at t (the sum of the node estimates of [0, t]'s dyadic
decomposition, Honaker's variance-optimal estimates by default, `honaker: false` for the plain tree), s = sigma C.
The tree restarts at each epoch (the paper's "tree restart" / TF-Privacy's `restart_every_epoch`).

Formal guarantee (certified): every release is post-processing of C g + z over the run, C the restarted trees'
node-incidence matrix, z i.i.d. N(0, s^2); one example joins one step per epoch at the same offset, so its
columns lie in different trees and the L2 sensitivity is 2C sqrt(E h) under replace-one (the relation of the
fixed-size batches that run; 2C per participation), h = floor(log2 P) + 1 the nodes holding a tree's first
leaf. The certified event is one `GaussianDpEvent(sigma / (2 sqrt(E h)))`, composed by PLD. The sensitivity is
computed from the strategy and the executed participation (`mechanisms.parts.correlated_noise`), not from h.

Claim (`claim`): the paper's accountant, tensorflow_privacy's `compute_rdp_tree_restart` (Appendix D): RDP
alpha * sum_epochs h / (2 z^2), converted to (epsilon, delta) with dp-accounting's RDP conversion. The paper
states zero-out (add/remove) neighbours, z = sigma; the claim is stated under privbench's replace-one relation,
z = sigma / 2 (its zero-out value is recorded as `epsilon_zero_out`). RDP is looser than PLD, so a correct run
is `ok` with claimed >= certified.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from mechanisms.catalog.matrix_factorization import CorrelatedNoiseMechanism, fixed_order
from mechanisms.framework.mechanism import Claim

if TYPE_CHECKING:
    from mechanisms.parts.correlated_noise import RestartedTree
    from mechanisms.parts.plan import Parts, PrivacySpec

ID = "dpftrl-tree"
CLAIMED_BY = "rdp tree restart (Kairouz et al. 2021 App. D, tensorflow_privacy compute_rdp_tree_restart), replace-one"


@dataclasses.dataclass(frozen=True)
class Options:
    honaker: bool = True  # Honaker's variance-optimal node estimates (releases nothing more than the plain tree)


def tree_restart_rdp(noise_multiplier: float, steps_list: list[int], orders: Any) -> list[float]:
    """The paper's RDP of restarted trees: a Gaussian of squared sensitivity sum_i (floor(log2 steps_i) + 1)."""
    depths = sum(math.floor(math.log2(steps)) + 1 for steps in steps_list if steps > 0)
    return [order * depths / (2 * noise_multiplier ** 2) for order in orders]


def claimed_epsilon(sigma: float, steps_per_epoch: int, epochs: int, delta: float,
                    relation_factor: float = 2.0) -> float:
    """The paper's epsilon at noise multiplier sigma (per unit clip) for sensitivity `relation_factor` C per
    participation (2: replace-one, privbench's; 1: the paper's zero-out)."""
    # lazy: heavy (dp_accounting)
    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS, compute_epsilon

    rdp = tree_restart_rdp(sigma / relation_factor, [steps_per_epoch] * epochs, DEFAULT_RDP_ORDERS)
    return float(compute_epsilon(DEFAULT_RDP_ORDERS, rdp, delta)[0])


class DpFtrlTree(CorrelatedNoiseMechanism):
    ID = ID
    references = ("arXiv:2103.00039",)
    Options = Options

    def strategy(self, spec: PrivacySpec, options: Any) -> RestartedTree:
        from mechanisms.parts.correlated_noise import RestartedTree  # lazy: keeps the registries light

        return RestartedTree(fixed_order(spec).steps_per_epoch, honaker=options.honaker)

    def claim(self, sigma: float, spec: PrivacySpec, options: Any, parts: Parts, certified: float | None) -> Claim:
        sampler = parts.sampler
        claimed = claimed_epsilon(sigma, sampler.steps_per_epoch, sampler.epochs, spec.delta)
        zero_out = claimed_epsilon(sigma, sampler.steps_per_epoch, sampler.epochs, spec.delta, 1.0)
        height = sampler.steps_per_epoch.bit_length()
        return Claim(claimed, CLAIMED_BY, {"tree_height": height, "epsilon_zero_out": zero_out,
                                           "claimed_relation": "replace-one"})


mechanism = DpFtrlTree()

__all__ = ["CLAIMED_BY", "ID", "DpFtrlTree", "Options", "claimed_epsilon", "mechanism", "tree_restart_rdp"]
