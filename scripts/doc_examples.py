"""Regenerate the command examples of docs/commands.md and docs/mechanisms.md from what the commands print.

Every example sits between `<!-- example: NAME -->` and `<!-- /example -->`. For each, this runs the
`privbench` command line written in `EXAMPLES` (a fresh process, 100 columns) and writes the command and its
output into every block of that name: a `privacy` table as printed, an audit as the fields of its `--json`
record that the text cites (rounded to 4 significant digits; the table also prints a wall time, which
changes from run to run). Nothing in a block is typed by hand; tests/test_doc_examples.py checks that each
block is what its command prints now.

    python scripts/doc_examples.py [NAME ...]          # rewrite (default: every example)
    python scripts/doc_examples.py --check [NAME ...]  # exit 1 naming the blocks that drifted
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "docs" / "commands.md", ROOT / "docs" / "mechanisms.md"]
BLOCK = re.compile(r"(<!-- example: ([\w-]+) -->\n)(.*?)(<!-- /example -->)", re.S)
AUDIT_FIELDS = ("sigma", "dim", "samples", "epsilon_claimed", "epsilon_certified", "epsilon_audited", "mu_claimed",
                "mu_audited", "p_value", "claim_status")
SHUFFLED = "shuffled-dpsgd --epsilon 0.198 --delta 2.5e-7 --option batch_clip_ratio={r} --option flat_permutation={g}"


def _round(value: object) -> object:
    return float(f"{value:.4g}") if isinstance(value, float) else value


def audit_fields(record: dict) -> str:
    """The record's headline fields and, per case, its audited epsilon and mu and whether it refutes the claim."""
    head = {k: _round(record[k]) for k in AUDIT_FIELDS}
    cases = [{"case": c["case"], "epsilon_audited": _round(c["epsilon_audited"]), "mu_audited": _round(c["mu_audited"]),
              "violated": c["violated"]} for c in record["cases"]]
    return json.dumps(head) + "\n" + "\n".join(json.dumps(c) for c in cases)


def shuffled_table(records: Sequence[dict]) -> str:
    """docs/mechanisms.md's one-step audits of shuffled DP-SGD, one row per (c'/c, flat group)."""
    lines = ["| c'/c | flat group | sigma | eps claimed (one step) | eps certified | eps audited, per case | p-value "
             "| status |", "|---|---|---|---|---|---|---|---|"]
    for (ratio, group), r in zip(SHUFFLED_ROWS, records, strict=True):
        cases = ", ".join(f"{c['case']} " + (f"**{c['epsilon_audited']:.2f}** (below the claimed curve)"
                                              if c["violated"] else f"{c['epsilon_audited']:.2f}") for c in r["cases"])
        lines.append(f"| {ratio} | {group} | {r['sigma']:.3f} | {r['epsilon_claimed']:.3f} | "
                     f"{r['epsilon_certified']:.2f} | {cases} | {r['p_value']:.1e} | {r['claim_status']} |")
    return "\n".join(lines)


SHUFFLED_ROWS = [(1, "full"), (1, "blocks"), (16, "full"), (16, "blocks")]
GDP_ROWS = [("few steps", 0.8, 0.004, 10), ("the GDP paper's Fig. 4, 20 epochs", 1.06, 0.004267, 4688),
            ("the GDP paper's Fig. 4, 70 epochs", 0.638, 0.004267, 16406)]


def gdp_table(records: Sequence[dict]) -> str:
    """docs/mechanisms.md's PLD (sound) against the GDP CLT (claimed), one row per setting."""
    lines = ["| setting | sigma | q | T | PLD (sound) | GDP CLT (claimed) |", "|---|---|---|---|---|---|"]
    for (label, sigma, q, steps), r in zip(GDP_ROWS, records, strict=True):
        pld, gdp = r["epsilons"]["pld"], r["epsilons"]["gdp"]
        low = f" ({pld / gdp:.1f}x too low)" if pld > 2 * gdp else ""
        lines.append(f"| {label} | {sigma} | {q} | {steps} | {pld:.3f} | {gdp:.3f}{low} |")
    return "\n".join(lines)


# name -> (command lines after `privbench`, whether the default test suite checks it: the rest take seconds each)
EXAMPLES: dict[str, tuple[list[str], bool]] = {
    "privacy-epsilon": (["privacy epsilon --sigma 1.1 --sample-rate 0.004 --steps 2500 --delta 1e-5 --accountant all"],
                        True),
    "privacy-sigma": (["privacy sigma --epsilon 2 --sample-rate 0.004 --steps 2500 --delta 1e-5"], True),
    "privacy-agm": (["privacy agm --epsilon 1 --delta 1e-5"], True),
    "audit-dpsgd": (["audit dpsgd --sigma 1 --json"], True),
    "audit-shuffled": (["audit shuffled-dpsgd --epsilon 0.2 --option batch_clip_ratio=16 --json"], False),
    "audit-shuffled-table": ([f"audit {SHUFFLED.format(r=r, g=g)} --json" for r, g in SHUFFLED_ROWS], False),
    "gdp-clt-table": ([f"privacy epsilon --sigma {s} --sample-rate {q} --steps {t} --delta 1e-5 --accountant all "
                       "--json" for _, s, q, t in GDP_ROWS], True),
    "audit-dp-forward": (["audit dp-forward --sigma 1 --option sensitivity=C --option freeze_pre_noise=true --json",
                          "audit dp-forward --sigma 1 --option sensitivity=2C --option freeze_pre_noise=true --json"],
                         False),
}


def run(command: str) -> str:
    """`privbench COMMAND`'s stdout in a fresh process at 100 columns (rich reads COLUMNS when it starts)."""
    env = os.environ | {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "orchestrator", *shlex.split(command)], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"`privbench {command}` exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def render(name: str) -> str:
    """The block's body: each command, then what it printed (or the fields of its JSON record)."""
    commands, _ = EXAMPLES[name]
    outputs = [run(c) for c in commands]
    shell = "\n".join(f"$ privbench {c}" for c in commands)
    tables = {"audit-shuffled-table": shuffled_table, "gdp-clt-table": gdp_table}
    if name in tables:
        return f"```\n{shell}\n```\n\n{tables[name]([json.loads(o) for o in outputs])}\n"
    if commands[0].endswith("--json") and commands[0].startswith("audit"):
        body = "\n".join(f"$ privbench {c}\n{audit_fields(json.loads(o))}" for c, o in zip(commands, outputs,
                                                                                            strict=True))
        return f"```\n{body}\n```\n(the record's headline fields and cases, rounded to 4 significant digits)\n"
    body = "\n".join(f"$ privbench {c}\n{o.rstrip()}" for c, o in zip(commands, outputs, strict=True))
    return f"```\n{body}\n```\n"


def blocks(names: Sequence[str] | None = None) -> dict[str, list[tuple[Path, str]]]:
    """name -> [(page, current body)] for every example block in the docs (only `names`, when given)."""
    found: dict[str, list[tuple[Path, str]]] = {}
    for page in PAGES:
        for m in BLOCK.finditer(page.read_text()):
            if names is None or m.group(2) in names:
                found.setdefault(m.group(2), []).append((page, m.group(3)))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    found = blocks(args.names or None)
    unknown = (set(args.names) | set(found)) - set(EXAMPLES)
    if unknown:
        raise SystemExit(f"unknown example(s): {', '.join(sorted(unknown))}; known: {', '.join(EXAMPLES)}")
    drifted = []
    for name in found:
        body = render(name)
        for page, current in found[name]:
            if current != body:
                drifted.append(f"{page.relative_to(ROOT)}: {name}")
                if not args.check:
                    text = page.read_text()
                    pattern = re.compile(rf"(<!-- example: {name} -->\n).*?(<!-- /example -->)", re.S)
                    page.write_text(pattern.sub(lambda m, body=body: m.group(1) + body + m.group(2), text))
    if drifted:
        print(("drifted: " if args.check else "rewrote: ") + "; ".join(drifted))
    return 1 if drifted and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
