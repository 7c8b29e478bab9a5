"""`run_trial`: the unit of work. A plain function of a resolved trial config, testable without Ray.

It never raises and never writes to the store: it returns a `TrialResult` record, `failed` with the
traceback when anything goes wrong, and the driver records it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import random
import socket
import time
import traceback
from typing import Any

import numpy as np
import torch

import mechanisms
from mechanisms.claims import claim_status
from mechanisms.plan import PrivacySpec
from workers import datasets, models
from workers.audit import AuditConfig, OneRun, audit_cost, mia_fields, step_audit
from workers.environment import configure
from workers.result import TrialResult
from workers.train import Diverged, Progress, TrainConfig, train

VERSIONED = ("torch", "opacus", "dp-accounting", "transformers", "numpy", "ray", "mlflow")


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def seed_everything(seed: int) -> torch.Generator:
    """Seed the global generators (model initialisation, dropout) and return the batch-selection one."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def noise_generator(seed: int, device: torch.device, secure: bool = False) -> torch.Generator:
    """The generator of the privacy noise: derived from the trial seed (a rerun reproduces the trial) on
    the training device, or, with `secure_rng: true`, Opacus' secure generator (torchcsprng, reading the
    OS's entropy), which cannot be reproduced by design."""
    if secure:
        try:
            import torchcsprng
        except ImportError:
            raise ValueError("secure_rng: true needs torchcsprng (Opacus' secure generator), which is not "
                             "installed") from None
        return torchcsprng.create_random_device_generator("/dev/urandom")
    (state,) = np.random.SeedSequence([seed, 1]).generate_state(1, dtype=np.uint64)
    return torch.Generator(device=device).manual_seed(int(state) >> 1)


def pick_device(gpus: float) -> torch.device:
    """CUDA when a GPU was granted and is usable; otherwise CPU (a granted but absent GPU is not fatal)."""
    return torch.device("cuda") if gpus > 0 and torch.cuda.is_available() else torch.device("cpu")


def privacy_spec(config: dict[str, Any], cfg: TrainConfig, dataset_size: int,
                 trainable: list[torch.nn.Parameter] | None = None) -> PrivacySpec:
    delta = config["delta"]
    if delta == "1/(2N)":  # resolved here, where N (the training set actually used) is known
        delta = 1 / (2 * dataset_size)
    return PrivacySpec(
        epsilon=config.get("epsilon"), delta=float(delta), dataset_size=dataset_size,
        batch_size=cfg.batch_size, epochs=cfg.epochs, clip=cfg.clip,
        calibration=config.get("calibration", "claimed"), accountant=config.get("accountant", "pld"),
        sampler=config.get("sampler", "poisson"), sigma=config.get("sigma"),
        options=config.get("mechanism_options", {}),
        model_dim=sum(p.numel() for p in trainable) if trainable else None,
        n_tensors=len(trainable) if trainable else None,
        tensor_sizes=tuple(p.numel() for p in trainable) if trainable else None,
    )


def run_trial(config: dict[str, Any], on_progress: Progress | None = None) -> dict[str, Any]:
    """Run one (dataset, model, mechanism, epsilon, seed) trial and return its result record."""
    configure()
    started = time.time()
    env = {"hostname": socket.gethostname(), "pid": os.getpid(), "versions": library_versions(),
           "started_at": started}
    try:
        gpus = float(config.get("resources", {}).get("gpus", 0) or 0)
        cpus = int(config.get("resources", {}).get("cpus", 1) or 1)
        torch.set_num_threads(max(1, cpus))
        device = pick_device(gpus)
        env |= {"device": device.type, "gpus_granted": gpus, "cpus": cpus} | _ray_node()
        cfg = TrainConfig(**config.get("train", {}))
        mechanism = mechanisms.get(config["mechanism"])
        generator = seed_everything(int(config["seed"]))
        splits = datasets.load(config["dataset"], config.get("dataset_options", {}))
        train_split = splits.train
        if cfg.max_train_examples and cfg.max_train_examples < len(train_split):
            keep = np.random.default_rng(0).permutation(len(train_split))[: cfg.max_train_examples]
            train_split = train_split.subset(np.sort(keep))
        bundle = models.build(config["model"], splits, config.get("model_options", {}))
        t0 = time.perf_counter()
        trainable = [p for p in bundle.module.parameters() if p.requires_grad]
        plan = mechanism.plan(privacy_spec(config, cfg, len(train_split), trainable))
        calibration_s = time.perf_counter() - t0
        audit_cfg = AuditConfig(**config.get("audit", {}))
        private = plan.sigma is not None or plan.epsilon_claimed is not None
        one_run = OneRun(audit_cfg, plan, int(config["seed"])) if audit_cfg.one_run and private else None
        secure = bool(config.get("secure_rng", False))
        outcome = train(bundle, train_split, {"val": splits.val, "test": splits.test}, mechanism, plan, cfg,
                        device=device, generator=generator, on_progress=on_progress,
                        noise_generator=noise_generator(int(config["seed"]), device, secure), secure_mode=secure,
                        attach=one_run.attach if one_run else None)
        audits: dict[str, Any] = {"epsilon_audited": None}
        if one_run is not None:
            audits |= one_run.fields(plan.delta, outcome.metrics.get("train_s"))
        audits |= mia_fields(bundle, train_split, splits.test, audit_cfg, device=device, seed=int(config["seed"]))
        audits |= audit_cost(audits, outcome.metrics.get("train_s"))
        if audit_cfg.step and private:
            audits |= step_audit(mechanism, plan, cfg.clip, audit_cfg, dict(config.get("mechanism_options", {})),
                                 int(config["seed"]), cpus, [p.numel() for p in trainable])
        privacy = plan.as_record() | audits | {
            "epsilon_target": config.get("epsilon"),
            "grad_sample_mode": outcome.info.get("grad_sample_mode") if private else None,
            "bk_fallback": outcome.info.get("bk_fallback") if private else None,  # why bk could not clip it
            "claim_status": claim_status(plan.epsilon_claimed, plan.epsilon_certified, audits["epsilon_audited"],
                                         audit_violated=bool(audits.get("audit_step_violated")
                                                              or audits.get("audit_run_violated")),
                                         private=private),
        }
        if "audit_step_p_value" in audits:  # the verdict without the step audit: a sweep applies Holm to it
            privacy["claim_status_without_step"] = claim_status(
                plan.epsilon_claimed, plan.epsilon_certified, audits["epsilon_audited"],
                audit_violated=bool(audits.get("audit_run_violated")), private=private)
        metrics = outcome.metrics | {"wall_s": time.time() - started, "calibration_s": calibration_s,
                                     "n_train": float(len(train_split))}
        return TrialResult(config["sweep"], config["trial_key"], "finished", config, metrics, outcome.curves,
                           privacy, env | {"finished_at": time.time()}).to_record()
    except Exception as exc:  # noqa: BLE001 - a failed trial is a result, not a crash
        return TrialResult(
            config.get("sweep", "?"), config.get("trial_key", "?"), "failed", config,
            metrics={"wall_s": time.time() - started}, environment=env | {"finished_at": time.time()},
            error=str(exc) if isinstance(exc, Diverged) else f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
        ).to_record()


def _ray_node() -> dict[str, str | None]:
    """Which Ray node ran the trial (informational; empty outside Ray)."""
    try:
        import ray

        if not ray.is_initialized():
            return {}
        return {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address()}
    except Exception:  # noqa: BLE001 - informational only
        return {}


__all__ = ["run_trial"]
