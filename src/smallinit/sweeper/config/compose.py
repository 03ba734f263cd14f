"""Overrides -> composed Hydra config -> validated TrialSpec, on the driver.

Every trial is composed and validated here before anything launches, so a bad override
stops the command with one line and leaves nothing behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from smallinit.core.errors import ConfigError
from smallinit.core.trial_dir import TrialDir
from smallinit.sweeper.runtime.resources import trial_workers
from smallinit.trainer.config import trial_config_from_dict
from smallinit.trainer.distributed import check_split

from .points import PointComposer
from .space import SweepSpace
from .spec import TrialSpec


class Composer:
    """Overrides -> composed Hydra config -> validated TrialSpec, on the driver."""

    def __init__(self, loader, base: DictConfig, space: SweepSpace, sweep_dir: Path):
        self.loader, self.base, self.space, self.sweep_dir = loader, base, space, sweep_dir
        # A full Hydra compose runs once per distinct set of structure overrides (group choices,
        # +/~ edits: sweeper/config/points.py). Validation builds every grid point before launch and
        # planning asks again to write its folder, so each point is built once.
        self.points = PointComposer(lambda overrides: loader.load_sweep_config(base, overrides),
                                    lambda path: loader.repository.group_exists(path))
        self._built: dict[str, TrialSpec] = {}
        self.prepared: dict = {}  # CorpusData -> PreparedData, once the driver has checked the trials

    def hand_over(self, prepared: dict) -> None:
        """Give each trial the corpus the driver prepared and checked it against, so its worker
        opens that cache rather than hashing the inputs again (data/pipeline.still_usable says
        when a worker on another machine must prepare its own)."""
        self.prepared = prepared
        for spec in self._built.values():
            spec.prepared = prepared.get(spec.trial.data)

    def spec(self, params: dict[str, Any], write: bool = False) -> TrialSpec:
        key = json.dumps(params, sort_keys=True, default=str)
        if key not in self._built:
            self._built[key] = self._build(params)
        spec = self._built[key]
        if write:  # Hydra's job-folder convention: the composed config and the overrides
            out = TrialDir(spec.out_dir)
            out.hydra_config.parent.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(OmegaConf.create(self.points.job(spec.overrides, resolve=False)), out.hydra_config)
            OmegaConf.save(OmegaConf.create(spec.overrides), out.hydra_overrides)
            # The resolved config too: a trial whose worker dies before training starts has no
            # trial.json, and the results table still needs its row.
            out.write_sweep_plan(spec.params, spec.overrides, spec.identity, spec.trial.to_dict(), spec.workers)
        return spec

    def _build(self, params: dict[str, Any]) -> TrialSpec:
        overrides = self.space.overrides_for(params)
        container = self.points.job(overrides)
        data = container.get("data", {})
        for key in ("paths", "val_paths"):  # workers may run elsewhere: pin user files
            if data.get(key):
                given = [data[key]] if isinstance(data[key], str) else data[key]
                data[key] = [str(Path(p).expanduser().absolute()) for p in given]
        trial = trial_config_from_dict(container)  # validates the data settings too
        ray_cfg, wandb_cfg = container.get("ray", {}), container.get("wandb", {})
        workers = trial_workers(trial, ray_cfg)
        check_split(trial, workers)
        identity = trial.identity(workers)  # N > 1 workers train their own trial (trainer/config.py)
        spec = TrialSpec(
            identity=identity, trial=trial, out_dir=str(TrialDir.in_sweep(self.sweep_dir, identity).path),
            params=dict(params), overrides=overrides, sweep_name=str(container.get("name", "sweep")),
            wandb=dict(wandb_cfg), threads=int(ray_cfg.get("cpus_per_trial") or 1),
            workers=workers, gpus=float(ray_cfg.get("gpus_per_trial") or 0),
            prepared=self.prepared.get(trial.data),
        )
        return spec


def validate_sweep(composer: Composer) -> tuple[list[TrialSpec], list[TrialSpec]]:
    """(every grid point's spec, the specs that were checked). A grid checks all its points;
    a search cannot enumerate its space, so it checks the corners and has no fixed points."""
    space = composer.space
    if space.mode == "grid":
        specs = [composer.spec(p) for p in space.grid()]
        check_distinct(specs)
        return specs, specs
    return [], [composer.spec(p) for p in corner_params(space)]


def check_distinct(specs: list[TrialSpec]) -> None:
    """Two grid points with one identity would be one trial folder trained twice: refused,
    naming the swept keys that do not change what a trial computes (train.threads, ray.*, ...)."""
    first: dict[str, TrialSpec] = {}
    for spec in specs:
        other = first.setdefault(spec.identity, spec)
        if other is spec:
            continue
        keys = [k for k in spec.params if spec.params[k] != other.params.get(k)]
        shown = " ".join(f"{k}={other.params[k]},{spec.params[k]}" for k in keys)
        raise ConfigError(f"{shown} is invalid in a sweep: {', '.join(keys)} is not part of a trial's identity "
                          "(it changes where or how a trial runs, not its numbers), so these grid points are one "
                          "trial; give one value")


def corner_params(space: SweepSpace) -> list[dict[str, Any]]:
    """Points that test every swept value's validity without enumerating a search space:
    the low and high ends of each interval, each discrete value."""
    base = {k: c.values[0] for k, c in space.discrete.items()}
    base.update({k: d.low for k, d in space.intervals.items()})
    points = [base]
    for key, dist in space.intervals.items():
        points.append({**base, key: dist.high})
    for key, choices in space.discrete.items():
        points += [{**base, key: v} for v in choices.values[1:]]
    return points
