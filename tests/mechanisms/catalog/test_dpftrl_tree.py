"""mechanisms/catalog/dpftrl_tree.py: `dpftrl-tree`'s certificate and claim against dp-accounting's own tree
aggregation and PLD (the references, not privbench's code)."""

from __future__ import annotations

import dp_accounting
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

import mechanisms
from mechanisms.framework.claims import claim_status
from tests.mechanisms.catalog.fixed_order_setting import DELTA, EPOCHS, P, spec
from tests.mechanisms.parts.test_correlated_noise import dense_tree

REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE
REPLACE_SPECIAL = dp_accounting.NeighboringRelation.REPLACE_SPECIAL


def test_tree_certificate_equals_dp_accountings_tree_aggregation():
    """Certified RDP and the claim equal dp-accounting's own RDP of tree aggregation restarted every epoch (E trees,
    one participation each: `SingleEpochTreeAggregationDpEvent` under `REPLACE_SPECIAL`, a record replaced by a
    zero one, sensitivity C; replace-one moves a node by 2C, the event at sigma / 2). The PLD certificate equals
    dp-accounting's PLD of the Gaussians one example's nodes receive, counted on the tree's incidence matrix."""
    sigma = 20.0
    plan = mechanisms.get("dpftrl-tree").plan(spec(sigma=sigma))

    def tree_rdp(noise_multiplier: float) -> float:
        tree = dp_accounting.SingleEpochTreeAggregationDpEvent(noise_multiplier, P)
        accountant = rdp_privacy_accountant.RdpAccountant(neighboring_relation=REPLACE_SPECIAL)
        return accountant.compose(dp_accounting.SelfComposedDpEvent(tree, EPOCHS)).get_epsilon(DELTA)

    reference = tree_rdp(sigma / 2)
    assert plan.epsilons["rdp"] == pytest.approx(reference, rel=1e-3)
    assert plan.epsilon_claimed == pytest.approx(reference, rel=1e-3)
    assert plan.extra["epsilon_zero_out"] == pytest.approx(tree_rdp(sigma), rel=1e-3)
    nodes = EPOCHS * int(dense_tree(P).sum(0).max())  # the most nodes of one tree that hold one leaf
    pld = dp_accounting.pld.PLDAccountant(REPLACE_ONE, value_discretization_interval=1e-4)
    gaussians = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), nodes)
    assert plan.epsilon_certified == pytest.approx(pld.compose(gaussians).get_epsilon(DELTA), rel=1e-3)
    assert plan.sampler == "fixed-order" and plan.neighboring_relation == "replace-one"
    assert claim_status(plan.epsilon_claimed, plan.epsilon_certified, None) == "ok"
