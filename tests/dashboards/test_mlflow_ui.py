"""What a user sees in `privbench ui`, read through the MLflow REST API of a real server subprocess:
the runs table opens (experiment kind) on the trials' key columns (the runs view), durations are the
trials' wall time, Source and Dataset are filled, and the sweep's parent run holds the grid, the
leaderboard and the figures."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from storage.mlflow_sink import SWEEP_RUN_ID_TAG
from storage.mlflow_view import RUNS_VIEW_KEY, RUNS_VIEW_TAG
from tests.dashboards.test_report import chromium
from tests.dashboards.test_ui import free_port


@pytest.fixture(scope="module")
def api(figure_store, tmp_path_factory):
    port = free_port()
    printed = tmp_path_factory.mktemp("ui") / "stdout.txt"
    with printed.open("w") as stdout:
        server = subprocess.Popen([sys.executable, "-m", "orchestrator", "ui", "--store", str(figure_store),
                                   "--port", str(port)], stdout=stdout, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
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


def test_experiment_opens_on_the_runs_table(runs):
    exp, _ = runs
    assert {t["key"]: t["value"] for t in exp["tags"]}["mlflow.experimentKind"] == "custom_model_development"


def test_experiment_carries_the_runs_view_of_the_key_columns(runs):
    """The view the printed link selects: the trials' key params, metrics and claim status, each a name the
    trial runs really have (a column MLflow cannot fill would be an empty one)."""
    exp, found = runs
    view = json.loads({t["key"]: t["value"] for t in exp["tags"]}[RUNS_VIEW_TAG])
    assert view["selectedColumns"] == view["columnOrder"] == [
        "params.`mechanism`", "params.`epsilon`", "params.`seed`", "params.`dataset`", "params.`model`",
        "metrics.`accuracy`", "metrics.`epsilon_certified`", "metrics.`epsilon_audited`", "tags.`claim_status`"]
    trial = next(r for r in found if tags(r).get("mechanism") == "dpsgd")
    data = {"params": {p["key"] for p in trial["data"]["params"]},
            "metrics": {m["key"] for m in trial["data"]["metrics"]}, "tags": set(tags(trial))}
    for column in view["selectedColumns"]:
        kind, name = column.split(".", 1)
        assert name.strip("`") in data[kind], column


def page_text(tmp_path, url: str, size: str = "1600,1200") -> str:
    """The text a browser shows for `url` once MLflow's single-page app has rendered it (the runs table draws
    only the columns inside the window)."""
    dom = chromium(tmp_path, "--virtual-time-budget=30000", f"--window-size={size}", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom.stdout))


@pytest.mark.slow
def test_the_printed_links_open_the_runs_table_in_a_browser(api, runs, tmp_path):
    """Viewed in headless Chromium: MLflow 3's UI shows its GenAI overview for an experiment unless the
    link says otherwise, and its runs table shows no param or metric column until one is picked. The link
    `privbench ui` prints selects the machine-learning pages and the sweep's runs view: the trials are rows
    (not collapsed under the sweep's run) with their mechanism, epsilon, seed, dataset, model, accuracy,
    epsilons and claim status. A trial's page, opened the same way, is a training run's page (not GenAI's
    "Evaluations") and shows duration, source and dataset."""
    exp, found = runs
    links = dict(re.findall(r"^(\S+): (http://\S+)$", api.printed, re.M))
    assert set(links) == {"figs", "figs-b"}
    assert links["figs"].endswith(f"/#/experiments/{exp['experiment_id']}/runs?workflowType=machine_learning"
                                  f"&viewStateShareKey={RUNS_VIEW_KEY}")
    table = page_text(tmp_path, links["figs"], "1920,1000")
    assert "Traces 0" not in table and "Detect Issues" not in table  # not the GenAI overview
    assert "shared view" in table and "does not exist" not in table  # the view loaded
    headers = table[table.index("Run Name"):]
    for shown in ("Parameters", "Metrics", "Created", "mechanism", "epsilon", "seed", "dataset", "model",
                  "accuracy", "epsilon_certified", "epsilon_audited", "claim_status"):
        assert re.search(rf"\b{shown}\b", headers), (shown, headers[:600])
    trials = [r for r in found if "privbench.trial_key" in tags(r)]
    for run in trials:  # every trial is a row of the first page, with its values
        assert run["info"]["run_name"] in table, run["info"]["run_name"]
    statuses = {tags(r)["claim_status"] for r in trials if "claim_status" in tags(r)}
    assert len(statuses) > 1  # the sweep has private trials that pass and GReDP's that do not
    for value in ("dpsgd", "gredp", "nonprivate", "digits", "mlp", *statuses):
        assert re.search(rf"\b{value}\b", headers), value
    trial = next(r for r in found if tags(r).get("mechanism") == "dpsgd")
    page = page_text(tmp_path, links["figs"].split("&")[0].replace("/runs?", f"/runs/{trial['info']['run_id']}?"))
    assert trial["info"]["run_name"] in page
    assert f"{exp['name']} Runs {trial['info']['run_name']}" in page  # breadcrumb: Runs, not Evaluations
    assert "Evaluations" not in page
    about = page[page.index("About this run"):]
    seconds = (trial["info"]["end_time"] - trial["info"]["start_time"]) / 1000
    assert re.search(r"Duration (\d+(\.\d+)?)s", about), about[:400]
    assert abs(float(re.search(r"Duration (\d+(\.\d+)?)s", about)[1]) - seconds) < 0.15
    assert "Source privbench" in about
    assert re.search(r"Datasets digits \([0-9a-f]{8}\) training", about, re.I), about[:600]


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
    top = {f["path"] for f in api(f"/api/2.0/mlflow/artifacts/list?run_id={run_id}")["files"]}
    assert {"grid.yaml", "leaderboard.csv", "leaderboard.md", "figures"} <= top
    figs = {f["path"] for f in api(f"/api/2.0/mlflow/artifacts/list?run_id={run_id}&path=figures")["files"]}
    assert figs == {f"figures/{k}.{x}" for k in ("privacy-utility", "overhead", "curves", "verdicts")
                    for x in ("pdf", "png")}

    def artifact(path: str) -> bytes:
        query = urllib.parse.urlencode({"path": path, "run_uuid": run_id})
        return api(f"/get-artifact?{query}", raw=True)

    assert b"name: figs" in artifact("grid.yaml")
    csv = artifact("leaderboard.csv").decode()
    assert csv.startswith("dataset,") and csv.count("\n") == 6  # header + 5 rows (nonprivate, 2 x 2 private)
    assert artifact("figures/verdicts.png").startswith(b"\x89PNG")
