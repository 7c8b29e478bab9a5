"""orchestrator/cluster.py: `gpus: auto` packs trials on a GPU by their measured memory (issue 19: the arithmetic,
the measurement on CPU, no GPU here, and that explicit shares and one trial per GPU keep their meaning); which Ray a
driver starts or joins; a full temporary folder said as such."""

from __future__ import annotations

import contextlib

import yaml

from orchestrator import cluster, grid
from tests.conftest import TINY
from workers.trial import step_memory


def test_packed_share_fits_k_trials_in_one_gpu():
    gpu = 80 * 1024.0
    per = lambda need: need * cluster.HEADROOM + cluster.CUDA_CONTEXT_MB  # noqa: E731
    for need in (50.0, 900.0, 3_000.0, 9_000.0, 20_000.0, 30_000.0, 60_000.0):
        share = cluster.packed_share(need, gpu)
        k = round(1 / share) if share < 1 else 1
        assert share * k <= 1.0  # Ray can place k of them on one GPU
        assert k == 1 or k * per(need) <= gpu  # and they fit in its memory with headroom
        assert k == cluster.MAX_PER_GPU or (k + 1) * per(need) > gpu  # as many as fit, at most MAX_PER_GPU
    assert cluster.packed_share(50.0, gpu) == 0.125  # small models: MAX_PER_GPU of them
    assert cluster.packed_share(30_000.0, gpu) == 1.0  # two do not fit: a whole GPU
    assert cluster.packed_share(8_000.0, gpu) == 0.1666  # six, each 1/6 rounded down to Ray's precision


def test_auto_explicit_and_whole_gpus():
    measured = (1_000.0, 80 * 1024.0)
    assert cluster.gpus_for("auto", 0.0, measured) == 0.0  # no GPU in the cluster: CPU
    assert cluster.gpus_for("auto", 1.0, None) == 1.0  # not measured: one trial per GPU
    assert cluster.gpus_for("auto", 1.0, (1_000.0, None)) == 1.0  # measured on CPU: no GPU size to pack by
    assert cluster.gpus_for("auto", 1.0, measured) == cluster.packed_share(*measured) < 1.0
    assert cluster.gpus_for(0.25, 1.0, measured) == 0.25  # an explicit share means what it says
    assert cluster.gpus_for(1, 1.0, measured) == 1.0  # and one trial per GPU stays available


def test_resolve_gpus_uses_each_trials_measurement():
    spec = grid.parse(yaml.safe_dump(TINY | {"grid": TINY["grid"] | {"model": ["mlp", "cnn-small"]}}))
    keys = {t.model: t.memory_key for t in spec.trials if t.mechanism == "dpsgd"}
    assert len({t.memory_key for t in spec.trials}) == 4  # model and mechanism change the memory
    memory = {keys["mlp"]: (500.0, 80 * 1024.0)}
    resolved = {(t.model, t.mechanism): t.resources.gpus for t in cluster.resolve_gpus(list(spec.trials), 1.0, memory)}
    assert resolved == {("mlp", "dpsgd"): cluster.packed_share(500.0, 80 * 1024.0), ("mlp", "nonprivate"): 1.0,
                        ("cnn-small", "dpsgd"): 1.0, ("cnn-small", "nonprivate"): 1.0}
    assert [t.trial_key for t in cluster.resolve_gpus(list(spec.trials), 1.0, memory)] == \
        [t.trial_key for t in spec.trials]  # where a trial runs is not what it computes
    seeds = grid.parse(yaml.safe_dump(TINY | {"seeds": [0, 1]}))
    assert len({t.memory_key for t in seeds.trials}) == 2  # the seed does not change the memory


def test_step_memory_measures_one_step_on_cpu():
    spec = grid.parse(yaml.safe_dump(TINY | {"grid": TINY["grid"] | {"mechanism": ["dpsgd"]},
                                             "train": TINY["train"] | {"batch_size": 256}}))
    need, gpu_mb = step_memory(spec.trials[0])
    assert gpu_mb is None and need >= 0  # no GPU here: the CPU step's extra resident memory, nothing to pack by


def test_no_address_means_a_new_local_ray_unless_a_job_names_its_cluster(monkeypatch):
    """Ray's own default without an address joins the latest `ray start` cluster on the machine; privbench asks for
    a new local instance ("local"), and inside `ray job submit` (RAY_ADDRESS set) leaves the address to Ray."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster._local() == "local"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert cluster._local() is None


def test_a_full_temporary_folder_is_said_as_such(tmp_path, monkeypatch):
    """Item 27: with TMPDIR full, a local Ray fails with "Timed out waiting for file"; the driver says why."""
    from tests.storage.test_store_faults import tiny_tmpfs

    with tiny_tmpfs(tmp_path / "tmp", "1m") as folder:
        monkeypatch.setenv("TMPDIR", str(folder))
        monkeypatch.delenv("RAY_TMPDIR", raising=False)
        with open(folder / "filler", "wb") as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        assert f"the temporary folder {folder} is full" in cluster._full_temp_folder()
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert cluster._full_temp_folder() is None
