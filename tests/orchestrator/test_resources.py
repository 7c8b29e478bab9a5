"""Resources: a GPU requested but absent, and a sweep spread over a two-node Ray cluster."""

from __future__ import annotations

import json

import ray
from ray.cluster_utils import Cluster


def test_gpu_granted_by_ray_but_absent_runs_on_cpu(cli, write_grid, store):
    ray.shutdown()
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)  # "local": never another test's `ray start` cluster
    try:
        grid = write_grid({"name": "gpu", "grid": {"dataset": ["digits"], "model": ["mlp"], "mechanism": ["dpsgd"]},
                           "audit": {"mode": "off"}, "resources": {"cpus": 1, "gpus": "auto"}})  # the device only
        result = cli("sweep", "run", grid, "--store", store)
        assert result.exit_code == 0, result.output
        status = json.loads(cli("sweep", "status", "gpu", "--store", store, "--json").stdout)
        assert status["counts"] == {"finished": 1}
        from storage.store import Store

        (record,) = Store(store).records("gpu")
        assert record["environment"]["gpus_granted"] == 1.0  # auto resolved to the cluster's GPU
        assert record["environment"]["device"] == "cpu"  # torch found no CUDA device: CPU, not a crash
    finally:
        ray.shutdown()


def test_sweep_on_a_two_node_cluster_uses_both_nodes(cli, write_grid, store):
    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        grid = write_grid({"name": "twonode", "seeds": [0, 1, 2, 3],
                           "grid": {"dataset": ["digits"], "model": ["mlp"], "mechanism": ["nonprivate"]},
                           "train": {"epochs": 3, "batch_size": 32, "lr": 0.1}})
        result = cli("sweep", "run", grid, "--store", store, "--address", cluster.address)
        assert result.exit_code == 0, result.output
        from storage.store import Store

        nodes = {r["environment"]["node_id"] for r in Store(store).records("twonode")}
        assert nodes == {cluster.head_node.node_id, worker.node_id}
    finally:
        ray.shutdown()
        cluster.shutdown()
