"""Every figure kind at both paper sizes of every venue: the figure is the venue's width, no text leaves
it, no two texts overlap (the window extent of every text artist matplotlib draws), no text is under 8 pt,
and the PDF embeds TrueType fonts only (pdffonts). Also the small things a reviewer notices: a blank
`tuning` figure is refused, the privacy-utility legend's swatches have the bars' colours, and an audited
bound of 0 stays on the log axis."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from typer.testing import CliRunner

from dashboards import figures
from dashboards.venues import VENUES
from storage.store import Store
from tests.dashboards.test_leaderboard import RECORDS

TOLERANCE_PX = 0.5


def drawn_texts(fig: Figure) -> list[tuple[Text, object]]:
    """(text artist, window extent) of every non-empty text matplotlib really draws (tick labels outside the
    view are never drawn, so they are not counted)."""
    FigureCanvasAgg(fig)
    drawn: list[Text] = []
    original = Text.draw

    def draw(self, renderer):
        drawn.append(self)
        return original(self, renderer)

    Text.draw = draw
    try:
        fig.canvas.draw()
    finally:
        Text.draw = original
    renderer = fig.canvas.get_renderer()
    return [(t, t.get_window_extent(renderer)) for t in drawn if t.get_visible() and t.get_text().strip()]


def layout_problems(fig: Figure) -> list[str]:
    texts = drawn_texts(fig)
    box = fig.bbox
    problems = [f"outside the figure: {t.get_text()!r}" for t, b in texts
                if b.x0 < box.x0 - TOLERANCE_PX or b.y0 < box.y0 - TOLERANCE_PX or b.x1 > box.x1 + TOLERANCE_PX
                or b.y1 > box.y1 + TOLERANCE_PX]
    for i, (t, a) in enumerate(texts):
        for u, b in texts[i + 1:]:
            if min(a.x1, b.x1) - max(a.x0, b.x0) > TOLERANCE_PX and min(a.y1, b.y1) - max(a.y0, b.y0) > TOLERANCE_PX:
                problems.append(f"overlap: {t.get_text()!r} and {u.get_text()!r}")
    problems += [f"{t.get_fontsize():g} pt: {t.get_text()!r}" for t, _ in texts if t.get_fontsize() < 8]
    return problems


@pytest.fixture(scope="module")
def sweeps(figure_store) -> dict[str, list[dict]]:
    store = Store(str(figure_store))
    return {"one sweep": store.records("figs"), "two sweeps": store.records("figs") + store.records("figs-b")}


@pytest.mark.parametrize("size", ["single", "double"])
@pytest.mark.parametrize("kind", figures.KINDS)
def test_every_kind_fits_its_width_with_no_clipped_or_overlapping_text(sweeps, kind, size):
    for venue in VENUES.values():
        for name, records in sweeps.items():
            fig = figures.build(kind, records, size=size, venue_name=venue.name)
            assert fig.get_size_inches()[0] == pytest.approx(venue.width_in(size))
            assert not layout_problems(fig), (venue.name, name, layout_problems(fig))


def test_hand_made_records_with_several_datasets_lay_out_too():
    records = RECORDS + [dict(r, config=r["config"] | {"dataset": "fashion-mnist", "model": "cnn-small"},
                              curves={"train_loss": [1.0, 0.5], "test_accuracy": [0.5, 0.7]}) for r in RECORDS]
    for kind in figures.KINDS:
        for size in ("single", "double"):
            assert not layout_problems(figures.build(kind, records, size=size)), (kind, size)


def tuned_records() -> list[dict]:
    """A tuned DP-SGD and a tuned DP-SGD-GDP cell on each of two datasets: `--kind tuning` has two panels."""
    from tests.dashboards.test_tuning_view import record

    return [dict(r, config=r["config"] | {"dataset": dataset, "model": model})
            for dataset, model in (("digits", "mlp"), ("fashion-mnist", "cnn-small"))
            for r in (record(0, 0.7, 0.80, runs=1, eps_tuned=2.5, cell=f"g-{dataset}"),
                      record(0, 0.6, 0.70, runs=1, cell=f"d-{dataset}", mechanism="dpsgd-gdp"))]


@pytest.mark.parametrize("size", ["single", "double"])
def test_the_tuning_figure_fits_its_width_with_no_clipped_or_overlapping_text(size):
    for venue in VENUES.values():
        fig = figures.build(figures.TUNING_KIND, tuned_records(), size=size, venue_name=venue.name)
        assert fig.get_size_inches()[0] == pytest.approx(venue.width_in(size))
        assert len(fig.axes) == 2 and not layout_problems(fig), (venue.name, layout_problems(fig))


def test_pdf_figures_embed_truetype_fonts_only(sweeps, tmp_path):
    assert shutil.which("pdffonts"), "pdffonts missing: scripts/setup.sh installs poppler-utils"
    for kind in (*figures.KINDS, figures.TUNING_KIND):
        records = tuned_records() if kind == figures.TUNING_KIND else sweeps["one sweep"]
        for size in ("single", "double"):
            out = tmp_path / f"{kind}-{size}.pdf"
            figures.save(figures.build(kind, records, size=size), out)
            fonts = subprocess.run(["pdffonts", str(out)], capture_output=True, text=True, check=True).stdout
            rows = fonts.splitlines()[2:]
            assert rows and all("TrueType" in r for r in rows) and not any("Type 3" in r for r in rows), fonts


def test_tuning_on_sweeps_without_tuned_cells_is_refused_before_writing(figure_store, tmp_path):
    from orchestrator.cli import app

    out = tmp_path / "tuning.png"
    result = CliRunner().invoke(app, ["plot", "figs", "--kind", "tuning", "--store", str(figure_store),
                                      "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 2 and "no tuned cells" in result.output and not out.exists()


def test_privacy_utility_legend_swatches_have_the_colours_of_their_bars(sweeps):
    fig = figures.privacy_utility(sweeps["one sweep"])
    (ax,) = fig.axes
    bars = {ln.get_color() for ln in ax.get_lines() if ln.get_linewidth() == 6}
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    swatch = legend.legend_handles[labels.index("audited to certified")]
    FigureCanvasAgg(fig).draw()
    # HandlerTuple draws one swatch per mechanism colour: the legend's artists for that entry
    drawn = {c.get_color() for c in legend.get_children()[0].findobj(lambda a: hasattr(a, "get_linewidth")
                                                                      and a.get_linewidth() == 6)}
    assert swatch is not None and bars and bars <= drawn


def test_an_audited_bound_of_zero_stays_on_the_log_axis():
    records = [r for r in RECORDS if r["config"]["mechanism"] != "gredp"]
    for r in records:
        if r["config"]["mechanism"] == "dpsgd":
            r["privacy"] = dict(r["privacy"], epsilon_audited=0.0)
    fig = figures.privacy_utility(records)
    (ax,) = fig.axes
    left, right = ax.get_xlim()
    for line in ax.get_lines():
        xs = [x for x in line.get_xdata() if x > 0]
        assert all(left <= x <= right for x in xs), (line, xs, left, right)
    assert any(ln.get_marker() == "<" for ln in ax.get_lines())  # the arrow head: the bar goes on to 0
    assert "audited bound 0" in [t.get_text() for t in fig.legends[0].get_texts()]
