"""conf/'s schema: the typed configs (trainer.config.TrialArgs and the sections below) registered
in Hydra's ConfigStore, so the YAML under conf/ holds presets, experiments and overrides only,
and composition refuses a key the dataclasses do not have or a value of the wrong type.

    _schema            the root (conf/config.yaml's first default): SmallinitConf
    _data_<kind>       one per data class (conf/data/<kind>.yaml starts from its own)

OmegaConf makes a frozen dataclass's node read-only, and Hydra merges YAML and overrides into
the schema, so what is registered is `schema(cls)`: the same fields, types and defaults as a
mutable dataclass. Composition gives a plain config; trainer.config.trial_config_from_dict
turns it into the frozen, validated objects.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

from smallinit.core.errors import ConfigError
from smallinit.data.anchor_task import AnchorData
from smallinit.data.config import CORPORA
from smallinit.trainer.config import TrialArgs


@dataclass(frozen=True)
class RayConf:
    """ray.*: where a sweep's trials run (a single run ignores it)."""

    # null = a local Ray started for the sweep; `auto` or `<head-ip>:6379` = an existing cluster
    # (the driver runs on one of its nodes).
    address: str | None = None
    num_cpus: float | None = None  # local Ray only; null = all cores, else a whole number >= 1
    num_gpus: float | None = None
    cpus_per_trial: float = 1  # also the torch threads each trial uses
    gpus_per_trial: float = 0  # fractions share a GPU, e.g. 0.25
    # Processes per trial: above 1, each trial is a Ray Train run of that many workers (train.parallel:
    # ddp or fsdp), each taking cpus_per_trial CPUs and gpus_per_trial GPUs and an equal share of train.batch_size.
    workers_per_trial: int = 1
    # GiB of one device: when set, each trial runs on the fewest FSDP workers (ray.workers_per_trial
    # doubled, each dividing train.batch_size) whose per-device estimate (trainer/machine/memory.py) fits it,
    # so one sweep over model sizes gives the small ones one worker and the large ones what they
    # need. Needs train.parallel=fsdp. null: every trial on ray.workers_per_trial.
    fit_device_gib: float | None = None
    # Where the local Ray (address null) listens. loopback = 127.0.0.1 only, so no other machine
    # reaches it. Where the installed Ray cannot be kept to it (a Ray outside the range pyproject.toml
    # requires, or one whose internals moved) the local Ray is not started: the sweep stops with one line
    # naming this key. all = Ray's own default, this machine's address: other machines can reach it.
    listen: str = "loopback"


@dataclass(frozen=True)
class WandbConf:
    """wandb.*: one W&B run per trial."""

    # auto = online if you have configured a key (WANDB_API_KEY or `wandb login`), else offline
    # (sync later with `wandb sync`); disabled turns it off.
    mode: str = "auto"
    project: str = "smallinit"
    entity: str | None = None


WANDB_MODES = ("auto", "online", "offline", "disabled")
WANDB_NAME_FORBIDDEN = ("/", "\\", "#", "?", "%", ":")


def check_wandb(wandb_cfg: dict[str, Any]) -> None:
    """Before launch: a mistyped mode would otherwise fail every trial in wandb.init."""
    mode = wandb_cfg.get("mode", "auto")
    if mode not in WANDB_MODES:
        raise ConfigError(f"wandb.mode={mode} is invalid: must be one of {', '.join(WANDB_MODES)}")
    for key in ("project", "entity"):  # W&B's own rule for the names, which it checks only in wandb.init
        name = wandb_cfg.get(key)
        if name is None:  # entity null: W&B's default; project absent: a caller checking the mode alone
            continue
        bad = sorted({c for c in str(name) if c in WANDB_NAME_FORBIDDEN})
        if not str(name or "").strip() or bad or len(str(name)) > 128:
            raise ConfigError(f"wandb.{key}={name} is invalid: must be 1-128 characters without "
                              f"{' '.join(WANDB_NAME_FORBIDDEN)}" + (f" (found {' '.join(bad)})" if bad else ""))


@dataclass(frozen=True)
class SmallinitConf(TrialArgs):
    """The root config: a trial's settings, and the run's name, seed, cluster and logging."""

    # Names the run's output folder; sweeps group their trials under it (sweeps/<name>).
    name: str = "smallinit"
    # One seed for the weights (init.seed) and the data order (train.seed): conf/config.yaml
    # points both at it, so `seed=0,1,2` sweeps paired replicates.
    seed: int = 0
    ray: RayConf = field(default_factory=RayConf)
    wandb: WandbConf = field(default_factory=WandbConf)


DATA = {**CORPORA, "anchor": AnchorData}  # conf/data/<kind>.yaml -> its class


def register() -> None:
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="_schema", node=schema(SmallinitConf), provider="smallinit")
    for kind, cls in DATA.items():
        store.store(name=f"_data_{kind}", node=schema(cls), provider="smallinit")


@functools.cache
def schema(cls: type) -> type:
    """`cls` as a mutable dataclass of the same fields (those not in __init__, such as a data
    class's `task`, included: they name the class in the composed config)."""
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        kind = _omegaconf_type(hints[f.name])
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "???"
        if dataclasses.is_dataclass(default) and kind is Any:
            default = "???"  # one of several classes (data): the config group's option picks it
        fields.append((f.name, kind, field(default_factory=functools.partial(_as_schema, default))))
    return dataclasses.make_dataclass(cls.__name__, fields, namespace={"schema_of": cls})


def allowed(key: str, node_type: Any = None) -> str | None:
    """What a dotted key may hold, for a one-line error ('a number', 'a list of integers or
    null'): from the schema class of its node as OmegaConf reports it (node_type), else found
    from the root. None where the schema does not say (an untyped value)."""
    hints = _hints(node_type)
    if hints is None:
        hints = _hints(schema(SmallinitConf))
        for part in key.split(".")[:-1]:
            hints = _hints(hints.get(part)) if hints else None
    hint = hints.get(key.rsplit(".", 1)[-1]) if hints else None
    return None if hint is None else _describe(hint)


def known_keys(node_type: Any) -> list[str] | None:
    """The keys of a node's schema class (node_type as OmegaConf reports it), or None."""
    hints = _hints(node_type)
    return None if hints is None else list(hints)


def _hints(node_type: Any) -> dict[str, Any] | None:
    cls = getattr(node_type, "schema_of", node_type)
    if not dataclasses.is_dataclass(cls):
        return None
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


_NAMES = {float: ("a number", "numbers"), int: ("an integer", "integers"), bool: ("true or false", "booleans"),
          str: ("a string", "strings")}


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) if a is not type(None) else "null" for a in args)
    if origin is tuple:
        return f"a list of {_NAMES.get(args[0], (None, str(args[0])))[1]}"
    if dataclasses.is_dataclass(hint):
        return f"a mapping of {[f.name for f in dataclasses.fields(hint)]}"
    return _NAMES.get(hint, (str(hint),))[0]


def _omegaconf_type(hint: Any) -> Any:
    """The annotation OmegaConf gets. A float field takes an int as it is (OmegaConf would make
    1 into 1.0, and the trial's identity hashes the value as given). Left Any, to the
    dataclass's own checks: a union OmegaConf cannot type (several classes; a list or one
    path), and an optional dataclass (model.ffn), because OmegaConf cannot merge an override
    such as model.ffn={type: moe} into a typed node that is null."""
    if hint is float:
        return int | float
    if dataclasses.is_dataclass(hint):
        return schema(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) > 1 or dataclasses.is_dataclass(rest[0]):
            return Any
        return _omegaconf_type(rest[0]) | None if len(rest) < len(args) else _omegaconf_type(rest[0])
    if origin is tuple:
        return list[_omegaconf_type(args[0])]
    return hint


def _as_schema(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return schema(type(value))(**{f.name: _as_schema(getattr(value, f.name)) for f in dataclasses.fields(value)})
    return value
