"""Write jax-privacy's numbers for privbench's correlated-noise strategies into
tests/mechanisms/parts/jax_privacy_references.json, the independent reference the default test suite checks the
strategies against (tests/mechanisms/parts/test_jax_privacy_reference.py), where jax-privacy is not installed.

jax-privacy is a test-only extra (`pip install -e .[references]`, or into a separate venv: it pins its own jax
and numpy). Run it where jax_privacy imports; `--check` recomputes and compares without writing:

    python scripts/jax_privacy_references.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "mechanisms" / "parts" / "jax_privacy_references.json"

# (bands, steps per epoch, epochs): cyclic (fixed-epoch) participation, and min-separation at the same k, b
BANDED = [(1, 4, 3), (2, 4, 3), (2, 7, 2), (3, 5, 4), (3, 10, 3), (5, 4, 3), (8, 8, 2), (8, 3, 4), (12, 12, 2)]
TREES = [(4, 3), (5, 2), (7, 3), (8, 2), (13, 2)]  # (leaves per tree, epochs)
ERRORS = [(2, 16), (4, 16), (16, 16)]  # (bands, steps): prefix-sum errors per step


def dense_tree(leaves: int, epochs: int):
    import numpy as np

    rows, level = [], 0
    while (1 << level) <= leaves:
        for k in range(leaves >> level):
            row = np.zeros(leaves)
            row[k << level:(k + 1) << level] = 1
            rows.append(row)
        level += 1
    return np.kron(np.eye(epochs), np.array(rows))


def compute() -> dict:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import jax_privacy
    from jax_privacy.matrix_factorization import sensitivity, toeplitz

    out: dict = {"jax_privacy": jax_privacy.__version__ if hasattr(jax_privacy, "__version__") else "unknown",
                 "banded": [], "trees": [], "errors": [], "coefficients": []}
    for bands, period, epochs in BANDED:
        steps = period * epochs
        coef = toeplitz.optimal_max_error_strategy_coefs(bands)
        c = toeplitz.materialize_lower_triangular(coef, steps)
        cyclic = sensitivity.fixed_epoch_sensitivity_for_X(c.T @ c, epochs)
        minsep = float(jnp.sqrt(toeplitz.minsep_sensitivity_squared(coef, period, epochs, steps)))
        single = float(jnp.sqrt(toeplitz.sensitivity_squared(coef, steps)))
        out["banded"].append({"bands": bands, "steps_per_epoch": period, "epochs": epochs, "cyclic": float(cyclic),
                              "min_separation": minsep, "single": single})
    for leaves, epochs in TREES:
        c = jnp.asarray(dense_tree(leaves, epochs))
        out["trees"].append({"leaves": leaves, "epochs": epochs,
                             "cyclic": float(sensitivity.fixed_epoch_sensitivity_for_X(c.T @ c, epochs))})
    for bands, steps in ERRORS:
        coef = toeplitz.optimal_max_error_strategy_coefs(bands)
        errors = toeplitz.per_query_error(strategy_coef=coef, n=steps)
        out["errors"].append({"bands": bands, "steps": steps, "per_query": [float(e) for e in errors]})
    out["coefficients"] = [float(c) for c in toeplitz.optimal_max_error_strategy_coefs(16)]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored file instead of writing it")
    args = parser.parse_args()
    values = compute()
    if args.check:
        stored = json.loads(OUT.read_text())
        same = json.dumps({k: v for k, v in stored.items() if k != "jax_privacy"}, sort_keys=True) == \
            json.dumps({k: v for k, v in values.items() if k != "jax_privacy"}, sort_keys=True)
        print("same as stored" if same else "differs from the stored file")
        return 0 if same else 1
    OUT.write_text(json.dumps(values, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)} (jax-privacy {values['jax_privacy']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
