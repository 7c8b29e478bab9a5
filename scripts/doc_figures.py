"""Regenerate the images of the docs from a store holding the quickstart sweep:

- docs/figures/quickstart-KIND-SIZE.png: `privbench plot quickstart --kind KIND --size SIZE` for every figure
  kind at both paper sizes (docs/results.md shows them);
- docs/figures/mlflow-runs.png: the MLflow UI as `privbench ui` serves it, the quickstart experiment opened
  from the experiments list in headless Chromium at 1400 x 800 px (docs/store.md shows it).

    python scripts/doc_figures.py --store DIR      # DIR holds the quickstart sweep (scripts/results.py runs it)
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "figures"
sys.path.insert(0, str(ROOT))


def privbench(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"`privbench {' '.join(args)}` exited {done.returncode}")


def plots(store: str, sweep: str) -> None:
    from dashboards.figures import KINDS

    for kind in KINDS:
        for size in ("single", "double"):
            privbench("plot", sweep, "--kind", kind, "--size", size, "--store", store,
                      "--out", str(FIGURES / f"{sweep}-{kind}-{size}.png"))


def screenshot(store: str, sweep: str) -> None:
    from tests.browser import Browser

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "orchestrator", "ui", "--store", store, "--port", str(port)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(base + "/api/2.0/mlflow/experiments/search?max_results=1", timeout=5).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("privbench ui did not come up") from None
                time.sleep(0.25)
        with Browser(1400, 800) as browser:
            browser.open(base + "/#/experiments")
            name = json.dumps(sweep)
            browser.wait_for(f"[...document.querySelectorAll('a')].some(a => a.textContent.trim() === {name})")
            browser.evaluate(f"[...document.querySelectorAll('a')].find(a => a.textContent.trim() === {name}).click()")
            browser.wait_for("[...document.querySelectorAll('[role=columnheader]')].some(h => "
                             "h.innerText.trim() === 'status') && document.body.innerText.includes('matching runs')")
            browser.screenshot(FIGURES / "mlflow-runs.png")
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="store holding the quickstart sweep")
    parser.add_argument("--sweep", default="quickstart")
    args = parser.parse_args()
    plots(args.store, args.sweep)
    screenshot(args.store, args.sweep)


if __name__ == "__main__":
    main()
