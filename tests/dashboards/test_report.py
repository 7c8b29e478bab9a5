"""`privbench report` renders in a real browser: headless Chromium draws the four figures."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def invoke(*args):
    from orchestrator.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


class Count(HTMLParser):
    """Element counts of a document, as the browser's DOM dump reports them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: dict[str, int] = {}
        self.figures_with_svg = 0
        self._in_figure = False

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if tag == "figure":
            self._in_figure = True
        elif tag == "svg" and self._in_figure:
            self.figures_with_svg += 1
            self._in_figure = False


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium missing: scripts/setup.sh installs Debian's chromium"
    profile = tmp_path / "profile"
    return subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=180)


def test_report_command_writes_one_self_contained_page(figure_store, tmp_path):
    out = tmp_path / "report.html"
    result = invoke("report", "figs", "figs-b", "--store", figure_store, "--out", out)
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert page.count("<svg") == 4 and page.count("<h3>") == 2  # four figures, the two grid files
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page)
    assert "name: figs-b" in page and "violated. An experiment refutes" in page
    assert "<th>sweep</th>" in page


def test_chromium_draws_the_report_figures(figure_store, tmp_path):
    from matplotlib.image import imread

    out = tmp_path / "report.html"
    assert invoke("report", "figs", "--store", figure_store, "--out", out).exit_code == 0
    dom = chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", out.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    count = Count()
    count.feed(dom.stdout)
    assert count.tags.get("figure") == 4 and count.figures_with_svg == 4
    # two leaderboard tables (privacy and audits, then cost), each a header and 5 rows
    assert count.tags.get("path", 0) > 200 and count.tags.get("tr", 0) == 12
    assert count.tags.get("li", 0) == 4  # one verdict sentence per private row

    shot = tmp_path / "report.png"
    done = chromium(tmp_path, "--window-size=1280,2200", f"--screenshot={shot}", out.as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    pixels = imread(shot)[..., :3]
    top = pixels[150:900]  # the leaderboard's numbers, then the first figure
    assert pixels.std() > 0.05 and top.std() > 0.05
    coloured = (abs(pixels[..., 0] - pixels[..., 2]) > 0.3).mean()  # blue / orange lines and markers, not just text
    assert coloured > 0.001


@pytest.mark.slow
@pytest.mark.parametrize("window", [1280, 1400])
def test_report_fits_the_window_and_figures_keep_their_own_size(figure_store, tmp_path, window):
    """No sideways scrolling at 1280 or 1400 px (two sweeps: the widest leaderboard), and each figure drawn at
    the size matplotlib gave it (its text as set), not stretched to one common width."""
    import json

    out = tmp_path / "report.html"
    assert invoke("report", "figs", "figs-b", "--store", figure_store, "--out", out).exit_code == 0
    probe = tmp_path / "probe.html"  # the page plus a script that writes what the browser laid out
    probe.write_text(out.read_text().replace("</html>", (
        "<script>document.body.setAttribute('data-layout', JSON.stringify({page: "
        "document.documentElement.scrollWidth, table: Math.max(...Array.from("
        "document.querySelectorAll('table.leaderboard')).map(t => t.scrollWidth)), "
        "svgs: Array.from(document.querySelectorAll('figure svg')).map(s => s.getBoundingClientRect().width)}))"
        "</script></html>")))
    dom = chromium(tmp_path, f"--window-size={window},1000", "--virtual-time-budget=5000", "--dump-dom",
                   probe.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'data-layout="([^"]+)"', dom.stdout)
    assert found, dom.stdout[:500]
    layout = json.loads(found.group(1).replace("&quot;", '"'))
    assert layout["page"] <= window and layout["table"] <= window, layout
    page = out.read_text()
    own = [float(re.search(r'width="([\d.]+)pt"', svg).group(1)) * 96 / 72 for svg in re.findall(r"<svg[^>]*>", page)]
    assert len(layout["svgs"]) == len(own) == 4, layout
    for drawn, width in zip(layout["svgs"], own, strict=True):  # matplotlib's own size (points), not stretched
        assert drawn == pytest.approx(width, abs=1), (layout, own)
    for svg in re.findall(r"<svg[^>]*>", page):
        assert re.search(r'viewBox="', svg)

    shot = tmp_path / "report.png"
    done = chromium(tmp_path, f"--window-size={window},2400", f"--screenshot={shot}", out.as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
