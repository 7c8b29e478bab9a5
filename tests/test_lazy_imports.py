"""An import inside a function says why it is not at the module top, in one fixed form.

Imports belong at the top of their module, where a reader sees what the module needs. One stays inside a
function only where hoisting it would make a light path heavier (`import privbench`, `import mechanisms`,
the registries, `privbench --help`/`list`/`privacy`, grid validation, the read commands) or would load a
heavy package into a module the driver imports; it then carries a trailing comment (or one on the line above
when the line would pass 120 characters) in one of these forms:

    import torch  # lazy: heavy (torch)
    from dashboards import figures  # lazy: keeps privbench --help light
    from mechanisms.accounting import sound  # lazy: on first use (PEP 562)   (a package's `__getattr__`)
    import torchcsprng  # lazy: optional dependency                              (under `except ImportError`)

This test holds every library module to that; the import-light tests (tests/orchestrator/
test_small_command_imports.py, test_cli_robustness.py, ...) check that the light paths stay light.
"""

from __future__ import annotations

import ast
import re

from tests.test_import_cycles import _imports, modules

HEAVY = {"torch", "opacus", "scipy", "ray", "mlflow", "transformers", "matplotlib", "pandas", "sklearn",
         "dp_accounting", "datasets", "prv_accountant", "kymatio", "sqlalchemy", "alembic", "numpy", "PIL",
         "torchvision", "huggingface_hub", "tokenizers", "safetensors"}
REASON = re.compile(r"#\s*lazy:\s*(heavy \((?P<heavy>[\w, ]+)\)|keeps .+ light|on first use \(PEP 562\)"
                    r"|optional dependency)\s*(#.*)?$")


def _reason(lines: list[str], node: ast.stmt) -> re.Match | None:
    """The `# lazy:` comment of an import statement: trailing on one of its lines, or alone on the line above."""
    above = lines[node.lineno - 2] if node.lineno > 1 and lines[node.lineno - 2].strip().startswith("#") else ""
    return next(filter(None, map(REASON.search, [above, *lines[node.lineno - 1:node.end_lineno]])), None)


def unexplained(source: str, where: str) -> list[str]:
    """Each function-level import in `source` without a valid `# lazy:` reason, as `where:line: statement`."""
    lines = source.splitlines()
    problems = []
    for node, inside in _imports(ast.parse(source)):
        if not inside:
            continue
        found = _reason(lines, node)
        heavy = set(found["heavy"].replace(" ", "").split(",")) if found and found["heavy"] else set()
        if found is None or not heavy <= HEAVY:
            problems.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return problems


def test_every_function_level_import_says_why():
    problems = [p for name, path in modules().items() for p in unexplained(path.read_text(), name)]
    assert problems == [], ("imports inside functions without `# lazy: <reason>` (hoist them to the module "
                            "top, or say why they stay):\n" + "\n".join(problems))


def test_the_check_can_fail():
    source = ("import os\n"
              "def f():\n"
              "    import torch  # lazy: heavy (torch)\n"
              "    # lazy: keeps privbench list light\n"
              "    from dashboards import figures\n"
              "    import json\n"
              "    import yaml  # loaded late\n"
              "    import sys  # lazy: heavy (sys)\n"
              "    from a import (  # lazy: optional dependency\n"
              "        b,\n"
              "    )\n")
    assert unexplained(source, "m") == ["m:6: import json", "m:7: import yaml", "m:8: import sys"]
