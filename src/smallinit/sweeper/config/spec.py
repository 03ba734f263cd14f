"""What the driver hands a worker for one trial: the validated TrialConfig, its identity
(computed once, on the driver, from the config and the worker count; the trainer reads it and
never computes it again) and where and how it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from smallinit.trainer.config import TrialConfig


@dataclass
class TrialSpec:
    identity: str
    trial: TrialConfig
    out_dir: str
    params: dict[str, Any]
    overrides: list[str]
    sweep_name: str
    # wandb.* as composed under the root schema (mode, project, entity): WandbConf's defaults are
    # filled in there, so the worker reads them without a default of its own.
    wandb: dict[str, Any] = field(default_factory=dict)
    threads: int = 1
    # Its role under hydra.sweeper.protocol (tune or confirm), recorded in the study; None without.
    role: str | None = None
    # ray.workers_per_trial: above 1, a Ray Train run of that many workers, each with `threads`
    # CPUs and `gpus` GPUs (ray.cpus_per_trial, ray.gpus_per_trial are then per worker).
    workers: int = 1
    gpus: float = 0.0
    # The corpus the driver prepared and checked this trial against (a data.pipeline.PreparedData:
    # paths and counts, no tokens); None for the anchor task or a spec built before the check.
    prepared: Any = None

    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params.items()) or self.identity

    def tune_config(self, number: int) -> dict[str, Any]:
        """The trial's config as Tune carries it: the spec the worker runs (Tune pickles it), and
        beside it the swept values and the identity as plain scalars, so that Tune's dataframes
        (ExperimentAnalysis, ResultGrid) have a `config/<key>` column per swept key. Only the spec
        decides what trains: the identity is its hash, whatever Tune shows."""
        flat = {k: v for k, v in self.params.items() if isinstance(v, bool | int | float | str)}
        return {**flat, "identity": self.identity, "spec": self, "number": number}
