"""What a user sees in `privbench ui`, through the MLflow REST API of a real server subprocess and in headless
Chromium (slow tests): the experiment opened from MLflow's experiments list lands on its runs table with the
trials' key columns, rounded, within 1400 px; a trial's page groups its numbers; durations are the trials'
wall time, Source and Dataset are filled, and the sweep's own run holds the grid, the leaderboard and the
figures, out of the trials' list."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage.mlflow_sink import SWEEP_RUN_ID_TAG
from storage.mlflow_view import NAME_CHARS, ROOM_PX, RUNS_VIEW_COLUMNS, RUNS_VIEW_KEY, RUNS_VIEW_TAG, SCROLLBAR_PX
from tests.dashboards.test_ui import free_port


@pytest.fixture(scope="module")
def api(figure_store, tmp_path_factory):
    with serving(figure_store, tmp_path_factory.mktemp("ui")) as call:
        yield call


@contextlib.contextmanager
def serving(store: Path, folder: Path) -> Iterator[Any]:
    """`privbench ui` on `store`, its REST API as `call(path, body)`, the server stopped at the end."""
    port = free_port()
    printed, errors = folder / "stdout.txt", folder / "stderr.txt"
    with printed.open("w") as stdout, errors.open("w") as stderr:
        server = subprocess.Popen([sys.executable, "-m", "orchestrator", "ui", "--store", str(store),
                                   "--port", str(port)], stdout=stdout, stderr=stderr, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def call(path: str, body: dict | None = None, raw: bool = False):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as answer:
            payload = answer.read()
        return payload if raw else json.loads(payload)

    deadline = time.monotonic() + 120
    while True:  # wait until the server answers (it imports MLflow and migrates nothing: a few seconds)
        assert server.poll() is None, "the UI server exited"
        assert time.monotonic() < deadline, "the UI did not answer within 120 s"
        try:
            call("/api/2.0/mlflow/experiments/search", {"max_results": 10})
            break
        except OSError:
            time.sleep(0.2)
    call.printed = printed.read_text()  # what `privbench ui` told the user, before the server started
    call.base = base
    call.stderr_text = errors.read_text
    try:
        yield call
    finally:
        server.terminate()
        server.wait(timeout=30)


def tags(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


@pytest.fixture(scope="module")
def runs(api):
    exp = api("/api/2.0/mlflow/experiments/get-by-name?experiment_name=figs")["experiment"]
    found = api("/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 1000})
    return exp, found["runs"]


def test_experiment_is_a_model_training_experiment_with_the_sweep_as_its_description(runs):
    exp, _ = runs
    tags_ = {t["key"]: t["value"] for t in exp["tags"]}
    assert tags_["mlflow.experimentKind"] == "custom_model_development"
    summary = tags_["mlflow.note.content"]  # the sweep's summary: a line, then the compact leaderboard
    # plain text: the experiments list shows a description as it is written (issue 48, 4)
    assert summary.startswith('figs: 10 trials, 10 finished. Grid, leaderboard and figures: the run "figs (sweep)"')
    assert "| &ensp;mechanism&ensp; | &ensp;eps target&ensp; |" in summary  # padded: cells never run together


def test_experiment_carries_the_runs_view_of_the_key_columns(runs):
    """The view: rounded display params first, then seed, dataset and model; a search that lists trials only.
    Each column is a name the trial runs really have (a column MLflow cannot fill would be an empty one)."""
    exp, found = runs
    view = json.loads({t["key"]: t["value"] for t in exp["tags"]}[RUNS_VIEW_TAG])
    assert view["selectedColumns"] == view["columnOrder"] == [  # the run name, pinned left, leads with the mechanism
        "params.`eps tgt.`", "params.`acc.`", "params.`eps cert.`", "params.`eps aud.`", "params.`status`",
        "params.`seed`", "params.`dataset`", "params.`model`"]
    assert view["searchFilter"] == "tags.`privbench.trial_key` LIKE '%'"
    trial = next(r for r in found if tags(r).get("mechanism") == "gredp")
    params = {p["key"]: p["value"] for p in trial["data"]["params"]}
    for column in view["selectedColumns"]:
        assert column.split(".", 1)[1].strip("`") in params, column
    metrics = {m["key"]: m["value"] for m in trial["data"]["metrics"]}
    assert params["acc."] == f"{100 * metrics['accuracy']:.1f}"  # in %, as every output writes it
    assert float(params["eps cert."]) >= metrics["epsilon_certified"]  # rounded up: never under-reported
    assert len(params["eps cert."]) <= 5 and params["status"] == tags(trial)["claim_status"]


def test_a_trial_page_groups_its_numbers_in_its_description(runs):
    _, found = runs
    trial = next(r for r in found if tags(r).get("mechanism") == "dpsgd")
    note = tags(trial)["mlflow.note.content"]
    lines = note.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["- utility", "- privacy", "- audit", "- overhead"]
    assert "eps certified **" in lines[1] and "throughput **" in lines[3]
    assert not re.search(r"\d\.\d{5,}", note)  # rounded


def test_the_overhead_line_leads_with_the_trials_own_paired_step_time(figure_store):
    """A record of the fixture's is given a known paired ratio (its own, from the fewest rounds, varies with
    the load)."""
    import copy

    from storage.mlflow_view import trial_summary
    from storage.store import Store

    record = copy.deepcopy(next(r for r in Store(str(figure_store)).records("figs")
                                if r["config"]["mechanism"] == "dpsgd"))
    record["metrics"]["step_time_ratio"] = 1.6389
    overhead = trial_summary(record).splitlines()[3]
    assert overhead.startswith("- overhead: step time **1.64x**"), overhead


def widest_records() -> tuple[Any, list[dict]]:
    """A grid and its trials whose runs-table cells are the widest privbench writes: the longest registered
    mechanism, dataset and model names, every claim status, epsilons of three digits, 100% accuracy."""
    from mechanisms.framework import claims, registry
    from orchestrator import grid
    from workers.datasets import contract as datasets
    from workers.models import contract as models

    spec = grid.parse("name: widest\nseeds: [0, 1, 2, 3]\ndelta: 1.0e-5\n"
                      "grid: {dataset: [digits], model: [mlp], mechanism: [dpsgd], epsilon: [2, 100]}\n")
    mechanism, dataset, model = (max(names(), key=len) for names in (registry.names, datasets.names, models.names))
    records = []
    for i, trial in enumerate(spec.trials):
        config = trial.to_dict() | {"mechanism": mechanism, "dataset": dataset, "model": model}
        status = claims.STATUSES[i % len(claims.STATUSES)]
        certified = None if status == "uncertified" else 123.456 if status == "overclaimed" else config["epsilon"]
        records.append({"sweep": spec.name, "trial_key": trial.trial_key, "status": "finished", "config": config,
                        "metrics": {"accuracy": 1.0, "wall_s": 1.0},
                        "privacy": {"epsilon_claimed": config["epsilon"], "epsilon_certified": certified,
                                    "epsilon_audited": 10.019, "claim_status": status},
                        "environment": {"started_at": 1.7e9, "finished_at": 1.7e9 + 5}})
    return spec, records


def test_the_runs_view_fits_1400_px_and_no_registered_name_is_longer_than_it_shows_whole():
    """The slow test below measures in Chromium that the view's columns fit 1400 px with the widest trials'
    headers and cells whole (issue 48, 4: `eps certifie`, `overclaim…`, `fashion-…`, `cnn-sma`); this keeps,
    cheaply, what that measurement rests on: the widths within the room MLflow leaves them, a scrollbar's
    width to spare; the display params named as the view's columns; no registered mechanism, dataset or
    model name longer than `NAME_CHARS` (a longer one needs wider columns, measured again); and the slow
    test's trials the widest there are."""
    from mechanisms.framework import claims, registry
    from storage.mlflow_view import display_params
    from workers.datasets import contract as datasets
    from workers.models import contract as models

    assert sum(width for *_, width in RUNS_VIEW_COLUMNS) <= ROOM_PX - SCROLLBAR_PX
    for names in (registry.names, datasets.names, models.names):
        assert max(map(len, names())) <= NAME_CHARS, max(names(), key=len)
    _, records = widest_records()
    columns = {name for _, name, _ in RUNS_VIEW_COLUMNS}
    shown = [display_params(r) | {k: str(r["config"][k]) for k in ("seed", "dataset", "model")} for r in records]
    assert all(set(params) == columns for params in shown)
    assert {params["status"] for params in shown} == set(claims.STATUSES)
    assert max(len(params[c]) for params in shown for c in ("eps tgt.", "eps cert.", "eps aud.")) == 6  # 123.46
    assert {params["acc."] for params in shown} == {"100.0"}  # the widest a percentage is
    longest = max(registry.names(), key=len)
    assert {r["config"]["mechanism"] for r in records} == {longest} and len(longest) == NAME_CHARS


BROWSER_WIDTHS = (1400, 1920)
SHOTS = Path(tempfile.gettempdir()) / "privbench-ui-shots"  # the slow tests' screenshots, to look at
SHOTS.mkdir(exist_ok=True)
FIRST_COLUMNS = ("eps tgt.", "acc.", "eps cert.", "eps aud.", "status")


def open_from_the_list(browser, base: str, name: str) -> None:
    """As a person does: the experiments list, then a click on the sweep's name."""
    browser.open(base + "/#/experiments")
    browser.wait_for(f"[...document.querySelectorAll('a')].some(a => a.textContent.trim() === {json.dumps(name)})")
    browser.evaluate(f"[...document.querySelectorAll('a')].find(a => a.textContent.trim() === {json.dumps(name)})"
                     ".click()")


# Each run name's epsilon and seed (its first two words): [name, whether they reach past the name's cell]
CUT_NAMES_JS = """[...document.querySelectorAll('a')].filter(a => /seed\\d/.test(a.innerText)).map(a => {
    const text = a.firstChild && a.firstChild.nodeType === 3 ? a.firstChild : a;
    const range = document.createRange(); range.selectNodeContents(text);
    const words = a.innerText.split(' '); const seedEnd = words.findIndex(w => w.startsWith('seed')) + 1;
    const shown = words.slice(0, seedEnd).join(' ');
    const cell = a.closest('[role=gridcell]') || a.parentElement;
    const box = range.getBoundingClientRect(); const per = box.width / Math.max(1, a.innerText.length);
    return [a.innerText, box.left + per * shown.length > cell.getBoundingClientRect().right]; })"""
HEADERS_JS = """[...document.querySelectorAll('[role=columnheader]')].map(h => {
    const r = h.getBoundingClientRect(); return [h.innerText.trim(), r.left, r.right]; })"""
# The view's headers and cells whose text is cut (an element inside them that clips narrower than its text).
CUT_JS = """(() => { const cut = e => [...e.querySelectorAll('*')].some(d => d.scrollWidth > d.clientWidth + 1
        && getComputedStyle(d).overflow !== 'visible');
    const view = role => [...document.querySelectorAll(`[role=${role}]`)]
        .filter(e => (e.getAttribute('col-id') || '').startsWith('params.'));
    return [...view('columnheader'), ...view('gridcell')].filter(cut)
        .map(e => [e.getAttribute('col-id'), e.innerText.trim()]); })()"""
# The experiments list's description of sweep SWEEP: [its plain first line, where that line ends, where the
# cell stops showing text] (the Markdown after the line starts past the cell's edge: never shown)
DESCRIPTION_JS = """(() => { const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    let node = walker.nextNode(); while (node && !node.textContent.startsWith('SWEEP: ')) node = walker.nextNode();
    let clip = node.parentElement; while (clip.parentElement && getComputedStyle(clip).overflow === 'visible')
        clip = clip.parentElement;
    const range = document.createRange(); range.setStart(node, 0);
    range.setEnd(node, node.textContent.split('\\n')[0].length);
    return [range.toString(), range.getBoundingClientRect().right, clip.getBoundingClientRect().right]; })()"""
# Where the runs table's scrolled part shows columns: [left, right]
ROOM_JS = """(() => { const r = document.querySelector('.ag-center-cols-viewport').getBoundingClientRect();
    return [r.left, r.right]; })()"""
# Each run name's mechanism (its first word): [name, whether it reaches past what its cell shows]
MECHANISM_CUT_JS = """[...document.querySelectorAll('a')].filter(a => /seed\\d/.test(a.innerText)).map(a => {
    const walker = document.createTreeWalker(a, NodeFilter.SHOW_TEXT);
    let node = walker.nextNode(); while (node && !node.textContent.trim()) node = walker.nextNode();
    const range = document.createRange(); range.setStart(node, 0);
    range.setEnd(node, node.textContent.indexOf(' ') > 0 ? node.textContent.indexOf(' ') : node.textContent.length);
    let clip = a; while (clip.parentElement && getComputedStyle(clip).overflow === 'visible') clip = clip.parentElement;
    return [a.innerText, range.getBoundingClientRect().right > clip.getBoundingClientRect().right]; })"""


@pytest.mark.slow
@pytest.mark.parametrize("width", BROWSER_WIDTHS)
def test_the_experiment_opened_from_the_list_shows_the_trials_columns_rounded(api, runs, width):
    """Headless Chromium with a fresh profile: the sweep opened from MLflow's experiments list lands on its
    runs table (not the GenAI overview), lists the trials only (not the sweep's own run), and shows
    eps tgt., acc., eps cert., eps aud. and status, rounded, whole, within the window. The experiments list
    shows the summary's plain first line, the Markdown below it past the cell's edge (issue 48, 4: it read
    `**quickstart**: 6 trials…`)."""
    from tests.browser import Browser

    _, found = runs
    trials = [r for r in found if "privbench.trial_key" in tags(r)]
    with Browser(width, 1000) as browser:
        browser.open(api.base + "/#/experiments")  # the list shows a description as written, in one clipped line
        browser.wait_for("document.body.innerText.includes('figs: 10 trials')")
        line, line_end, cell_end = browser.evaluate(DESCRIPTION_JS.replace("SWEEP", "figs"))
        assert not re.search(r"[*|&`#]", line) and line_end >= cell_end, (line, line_end, cell_end)
        open_from_the_list(browser, api.base, "figs")
        browser.wait_for(f"{HEADERS_JS}.some(h => h[0] === 'status') && "
                         "document.body.innerText.includes('matching runs')")
        assert "/runs" in browser.evaluate("location.href")
        text = browser.text()
        assert "Traces\n0" not in text and "Detect Issues" not in text  # not the GenAI overview
        headers = {h: (left, right) for h, left, right in browser.evaluate(HEADERS_JS)}
        right = browser.evaluate(ROOM_JS)[1]  # the table's own edge, left of the window's
        for column in (*FIRST_COLUMNS, "seed", "dataset", "model"):  # every column docs/commands.md names
            assert column in headers and headers[column][1] <= right, (column, headers, right)
        assert browser.evaluate(CUT_JS) == []  # headers and values whole
        # run names whole: epsilon and seed not cut off
        cut = browser.evaluate(CUT_NAMES_JS)
        assert cut and not [name for name, clipped in cut if clipped], cut  # each name's "eps8 seed0" in view
        browser.screenshot(SHOTS / f"runs-{width}.png")
        order = [headers[c][0] for c in FIRST_COLUMNS]
        assert order == sorted(order)  # in this order, left to right
        assert f"{len(trials)} matching runs" in text
        assert not browser.evaluate("[...document.querySelectorAll('a')].some(a => a.textContent.includes('(sweep)'))")
        assert not re.search(r"\d\.\d{6,}", text)  # nothing like 7.999424731
        params = {p["key"]: p["value"] for p in trials[0]["data"]["params"]}
        assert params["eps cert."] in text and params["acc."] in text


@pytest.mark.slow
def test_the_widest_trials_show_every_header_and_cell_whole_at_1400_px(tmp_path):
    """In Chromium at 1400 px, the widest trials (`widest_records`: the longest registered names, every status,
    three-digit epsilons), written as the driver writes them: every column of the view in the window with a
    scrollbar's width to spare, every header and cell whole, and each run name's mechanism whole. Before:
    `eps targ`, `eps certifie`, `eps audite`, `overclaim…`, `fashion-…` and `model` past the table's edge."""
    from orchestrator import grid
    from storage.location import resolve
    from storage.store import Store
    from tests.browser import Browser

    spec, records = widest_records()
    st = Store(resolve(tmp_path / "store"), create=True)
    st.open_sweep(spec.name, spec.text, [t.to_dict() for t in spec.trials], key_of=grid.stored_key)
    for record in records:
        assert st.claim(spec.name, record["trial_key"])
        st.record(record)
    st.release(spec.name)
    st.close()
    with serving(tmp_path / "store", tmp_path) as call, Browser(1400, 1000) as browser:
        open_from_the_list(browser, call.base, spec.name)
        browser.wait_for(f"{HEADERS_JS}.some(h => h[0] === 'model') && "
                         f"document.body.innerText.includes({json.dumps(records[0]['config']['model'])})")
        browser.screenshot(SHOTS / "runs-widest-1400.png")
        headers = {h: (left, right) for h, left, right in browser.evaluate(HEADERS_JS)}
        left, right = browser.evaluate(ROOM_JS)
        assert abs(right - left - ROOM_PX) <= 1  # the room MLflow leaves the view's columns, as storage says
        for _, name, _ in RUNS_VIEW_COLUMNS:
            assert name in headers and headers[name][1] <= right - SCROLLBAR_PX, (name, headers, right)
        assert browser.evaluate(CUT_JS) == []
        names = browser.evaluate(MECHANISM_CUT_JS)
        assert len(names) == len(records) and not [name for name, cut in names if cut], names


@pytest.mark.slow
def test_the_printed_links_open_the_runs_view_and_a_trial_page(api, runs):
    """The links `privbench ui` prints: the experiments list, and per sweep its runs view (the view is
    stored on the experiment, so it works in a browser that has other columns saved). A trial's page is a
    training run's page with duration, source, dataset and the grouped description."""
    from tests.browser import Browser

    exp, found = runs
    links = dict(re.findall(r"^(\S+): (http://\S+)$", api.printed, re.M))
    assert set(links) == {"figs", "figs-b"} and f"MLflow UI: {api.base}/#/experiments" in api.printed
    # no share key: the front makes the view the browser's first one, so no "You're viewing a shared view" banner
    assert links["figs"].endswith(f"/#/experiments/{exp['experiment_id']}/runs?workflowType=machine_learning")
    trial = next(r for r in found if tags(r).get("mechanism") == "dpsgd")
    with Browser(1400, 1000) as browser:
        browser.open(links["figs"])
        browser.wait_for(f"document.body.innerText.includes({json.dumps(trial['info']['run_name'])})")
        browser.wait_for(f"{HEADERS_JS}.some(h => h[0] === 'status')")
        assert "shared view" not in browser.text() and RUNS_VIEW_KEY not in browser.evaluate("location.href")
        browser.open(links["figs"].split("&")[0].replace("/runs?", f"/runs/{trial['info']['run_id']}?"))
        browser.wait_for("document.body.innerText.includes('About this run')")
        browser.wait_for("document.body.innerText.includes('utility: accuracy')")
        page = re.sub(r"\s+", " ", browser.text())
    assert f"{exp['name']} Runs {trial['info']['run_name']}" in page and "Evaluations" not in page
    about = page[page.index("About this run"):]
    seconds = (trial["info"]["end_time"] - trial["info"]["start_time"]) / 1000
    assert abs(float(re.search(r"Duration (\d+(\.\d+)?)s", about)[1]) - seconds) < 0.15
    assert "Source privbench" in about
    assert re.search(r"Datasets digits \([0-9a-f]{8}\) training", about, re.I), about[:600]
    assert page.index("utility: accuracy") < page.index("Metrics (")  # the grouped numbers come first


def test_ui_prints_no_stray_server_lines(api):
    """Not MLflow's start-up noise (`from starlette.middleware.wsgi import ...`), nor a traceback when a
    browser closes a page that was loading (the slow tests above do)."""
    text = api.stderr_text()
    assert "starlette" not in text and "Warning" not in text and "Traceback" not in text, text[-2000:]


def test_trial_runs_carry_wall_time_source_and_dataset(runs):
    _, found = runs
    trials = [r for r in found if "privbench.trial_key" in tags(r)]
    parent = [r for r in found if tags(r).get("privbench.sweep_run") == "true"]
    assert len(trials) == 10 and len(parent) == 1
    durations = []
    for run in trials:
        wall_ms = next(m["value"] for m in run["data"]["metrics"] if m["key"] == "wall_s") * 1000
        durations.append(run["info"]["end_time"] - run["info"]["start_time"])
        assert abs(durations[-1] - wall_ms) < 500  # the trial's own time, not the time logging took
        t = tags(run)
        assert t["mlflow.source.name"] == "privbench"
        # the mechanism first: MLflow's run-name column cuts long names (issue 48, 4: `eps2 seed0 dpsgd-sh…`)
        assert re.fullmatch(r"[\w-]+ (eps[\d.]+ )?seed\d digits/mlp", run["info"]["run_name"]), run["info"]["run_name"]
        assert run["info"]["run_name"].startswith(f"{t['mechanism']} ")
        assert ("eps" in run["info"]["run_name"]) == (t["mechanism"] != "nonprivate")
        # linked to the sweep's run by a tag, not nested under it (the UI would collapse the trials)
        assert "mlflow.parentRunId" not in t and t[SWEEP_RUN_ID_TAG] == parent[0]["info"]["run_id"]
        assert re.fullmatch(r"[0-9a-f]{40}", t["mlflow.source.git.commit"])
        (inp,) = run["inputs"]["dataset_inputs"]
        assert inp["dataset"]["name"] == "digits" and len(inp["dataset"]["digest"]) == 8
        assert json.loads(inp["dataset"]["profile"])["num_rows"] > 1000
        assert {"key": "mlflow.data.context", "value": "training"} in inp["tags"]
    assert max(durations) > 1000  # a DP-SGD trial trains and audits for seconds, not the ~0.1 s logging takes

def test_parent_run_holds_grid_leaderboard_and_figures(api, runs):
    _, found = runs
    parent = next(r for r in found if tags(r).get("privbench.sweep_run") == "true")
    run_id = parent["info"]["run_id"]
    assert parent["info"]["status"] == "FINISHED"
    # its page shows the sweep's summary; its duration is its completed attempts' time
    assert tags(parent)["mlflow.note.content"].startswith("figs: 10 trials, 10 finished.")
    assert "&ensp;" in tags(parent)["mlflow.note.content"]  # padded cells: numbers of adjacent cells stay apart
    seconds = float(tags(parent)["privbench.sweep_seconds"])
    assert abs((parent["info"]["end_time"] - parent["info"]["start_time"]) / 1000 - seconds) < 0.01
    top = {f["path"] for f in api(f"/api/2.0/mlflow/artifacts/list?run_id={run_id}")["files"]}
    assert {"grid.yaml", "leaderboard.csv", "leaderboard.md", "figures"} <= top
    figs = {f["path"] for f in api(f"/api/2.0/mlflow/artifacts/list?run_id={run_id}&path=figures")["files"]}
    assert figs == {f"figures/{k}.png" for k in ("privacy-utility", "overhead", "curves", "verdicts")}

    def artifact(path: str) -> bytes:
        query = urllib.parse.urlencode({"path": path, "run_uuid": run_id})
        return api(f"/get-artifact?{query}", raw=True)

    assert b"name: figs" in artifact("grid.yaml")
    csv = artifact("leaderboard.csv").decode()
    assert csv.startswith("dataset,") and csv.count("\n") == 6  # header + 5 rows (nonprivate, 2 x 2 private)
    assert artifact("figures/verdicts.png").startswith(b"\x89PNG")
