"""The sweeper's settings, registered in Hydra's ConfigStore as hydra/sweeper=smallinit (with
conf/'s schema, sweeper/config/schema.py).

    hydra.sweeper.n_trials=20            trials of an Optuna search (grids run every point)
    hydra.sweeper.sampler=tpe            tpe | random | gp | grid
    hydra.sweeper.storage=null           null = sqlite:///<sweep dir>/optuna.db; any SQLAlchemy URL
    hydra.sweeper.max_concurrent=null    null = as many as the Ray cluster's CPUs allow
    hydra.sweeper.asha.enabled=true      ASHA early stopping on validation loss
    hydra.sweeper.reuse_workers=true     run trials back to back in the same Ray worker
    hydra.sweeper.protocol.tune=[optim.lr] hydra.sweeper.protocol.tune_seeds=[100]
    hydra.sweeper.protocol.confirm_seeds=[1,2,3,4]
    hydra.sweeper.protocol.per_budget=true  each train.budgets budget chooses its own values
                                         select, then confirm (sweeper/config/protocol.py)
Ray and W&B settings are top-level keys (ray.*, wandb.*: sweeper/config/schema.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from smallinit.core.errors import ConfigError


@dataclass
class AshaConf:
    enabled: bool = False
    # In optimizer steps; null = a quarter of a trial's steps.
    grace_period: int | None = None
    reduction_factor: int = 3


@dataclass
class ProtocolConf:
    """hydra.sweeper.protocol.*: select, then confirm (sweeper/config/protocol.py). Empty = no
    protocol: every grid point runs as given."""

    tune: list[str] = field(default_factory=list)
    tune_seeds: list[int] = field(default_factory=list)
    confirm_seeds: list[int] = field(default_factory=list)
    # The key the seeds are values of: `seed` sets both the init and the data order.
    seed_key: str = "seed"
    max_extensions: int = 2
    # With train.budgets: each budget chooses its own tuned values from its cooldown branch, and
    # the confirm seeds run every value some budget chose (one run serves every budget that chose it).
    per_budget: bool = False
    # With per_budget: each confirm run ends at the largest budget that chose its values
    # (train.stop_after), not at the plan's largest; each budget it trains is the same branch,
    # step for step. A value chosen only at 1M then costs 1M tokens a seed, not the whole plan's.
    confirm_to_chosen: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.tune or self.tune_seeds or self.confirm_seeds)


@dataclass
class SmallinitSweeperConf:
    _target_: str = "hydra_plugins.smallinit_sweeper.smallinit_sweeper.SmallinitSweeper"
    # Sweep overrides kept in a config (the command line wins key by key), as in Hydra's
    # Optuna plugin: {init.gamma: "0.5,1.0", optim.lr: "tag(log, interval(1e-4, 1e-2))"}.
    params: dict[str, str] | None = None
    n_trials: int = 20
    sampler: str = "tpe"
    seed: int = 0
    storage: str | None = None
    study_name: str | None = None
    max_concurrent: int | None = None
    max_failure_rate: float = 0.5
    # Crashed Ray workers are retried this many times (from the trial's checkpoint).
    max_retries: int = 2
    # Rerun trials recorded as failed (they are skipped by default: failures are deterministic).
    retry_failed: bool = False
    # Run the next trial in a finished trial's Ray worker instead of starting a new process:
    # saves the ~5 s process start and torch import per trial (bench/results.md).
    reuse_workers: bool = True
    # Tune's TensorBoard event files per trial (under <sweep>/ray/tune/). Off by default: the
    # logger imports torch into the driver, and metrics.jsonl and W&B hold the same numbers.
    tensorboard: bool = False
    asha: AshaConf = field(default_factory=AshaConf)
    protocol: ProtocolConf = field(default_factory=ProtocolConf)


def check_sweeper_conf(conf: SmallinitSweeperConf) -> None:
    if not (isinstance(conf.n_trials, int) and conf.n_trials > 0):
        raise ConfigError(f"hydra.sweeper.n_trials={conf.n_trials!r} is invalid: must be a positive integer")
    if not 0 <= conf.max_failure_rate <= 1:
        raise ConfigError(f"hydra.sweeper.max_failure_rate={conf.max_failure_rate!r} is invalid: must be in [0, 1]")
    if conf.max_concurrent is not None and conf.max_concurrent < 1:
        raise ConfigError(f"hydra.sweeper.max_concurrent={conf.max_concurrent!r} is invalid: must be >= 1 or null")


def register() -> None:
    from hydra.core.config_store import ConfigStore

    from . import schema

    ConfigStore.instance().store(group="hydra/sweeper", name="smallinit", node=SmallinitSweeperConf, provider="smallinit")
    schema.register()


def sweeper_conf_from(kwargs: dict[str, Any]) -> SmallinitSweeperConf:
    kwargs = {k: v for k, v in kwargs.items() if k != "_target_"}
    from omegaconf import OmegaConf

    kwargs = {k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in kwargs.items()}
    asha = AshaConf(**(kwargs.pop("asha", None) or {}))
    protocol = ProtocolConf(**(kwargs.pop("protocol", None) or {}))
    return SmallinitSweeperConf(**kwargs, asha=asha, protocol=protocol)
