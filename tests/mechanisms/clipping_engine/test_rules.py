"""Which module a rule takes: every layer family is registered once, a rule matches its exact class and not a
subclass (which may change the forward), and a family registered twice is refused."""

from __future__ import annotations

import pytest
from torch import nn

from mechanisms.clipping_engine.rules import Rule, register, rule_for, rules


def test_each_family_registers_one_rule():
    names = [rule.name for rule in rules()]
    assert sorted(names) == ["conv2d", "embedding", "hf-conv1d", "hf-vit-embeddings", "layernorm", "linear"]
    assert rules() == rules()  # importing the families again registers nothing twice


def test_a_rule_matches_the_exact_class_only():
    class LoraLinear(nn.Linear):
        """A subclass with its own forward: the engine's linear rule would clip the wrong gradient."""

    assert rule_for(nn.Linear(2, 2)).name == "linear"
    assert rule_for(nn.Conv2d(1, 1, 2)).name == "conv2d"
    assert rule_for(LoraLinear(2, 2)) is None
    assert rule_for(nn.GRU(2, 2)) is None


def test_a_family_registered_twice_is_refused():
    linear = rule_for(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="registered twice"):
        register(Rule(linear.name, linear.matches, linear.params, linear.forward))
    assert [rule.name for rule in rules()].count("linear") == 1
