"""What each trial asks Ray for (ray.cpus_per_trial, ray.gpus_per_trial), checked against
what a node can give before any trial is launched.

Ray does not refuse a request no node can meet: it warns after a minute and the sweep waits
forever. So a local Ray is checked against this machine before Ray starts (its CPUs, or
ray.num_cpus; its GPUs as torch sees them, or ray.num_gpus; and whether it can start as
promised: cluster.check_local_start), and any cluster against its live nodes right after connecting.
"""

from __future__ import annotations

import os
from typing import Any

from smallinit.core.errors import ConfigError, require

from .cluster import check_local_start, listen_setting


def _number(ray_cfg: dict[str, Any], key: str, default: float) -> float:
    value = ray_cfg.get(key)
    if value is None:
        return default
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    require(ok, f"ray.{key}", value, "must be a number >= 0")
    return float(value)


def workers(ray_cfg: dict[str, Any]) -> int:
    """ray.workers_per_trial: the processes of one trial, each asking for the per-trial CPUs and GPUs."""
    value = ray_cfg.get("workers_per_trial", 1)
    require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, "ray.workers_per_trial", value,
            "must be an integer >= 1")
    return value


# ray.fit_device_gib's choices by trainer.machine.memory.shape_key: the estimate traces the model, and a
# grid has many points of few shapes.
_fitted: dict[str, int | None] = {}


def trial_workers(trial, ray_cfg: dict[str, Any]) -> int:
    """The workers `trial` runs on: ray.workers_per_trial, or with ray.fit_device_gib the fewest
    FSDP workers from there (doubling, each dividing train.batch_size) whose per-device estimate
    fits a device of that many GiB. A trial nothing up to 64 workers fits is refused in one line."""
    count, gib = workers(ray_cfg), ray_cfg.get("fit_device_gib")
    if gib is None:
        return count
    require(isinstance(gib, int | float) and not isinstance(gib, bool) and gib > 0, "ray.fit_device_gib", gib,
            "must be a number of GiB > 0, or null")
    require(trial.train.parallel == "fsdp", "ray.fit_device_gib", gib,
            f"needs train.parallel=fsdp (it chooses FSDP worker counts), not train.parallel={trial.train.parallel}")
    from smallinit.trainer.machine.memory import (
        HEADROOM,
        estimate,
        fsdp_workers_to_fit,
        planned_dtype,
        shape_key,
    )

    dtype = planned_dtype(trial, gpu=_number(ray_cfg, "gpus_per_trial", 0) > 0)
    key = shape_key(trial, dtype, float(gib), count)
    if key not in _fitted:
        _fitted[key] = fsdp_workers_to_fit(trial, gib, dtype, start=count)
    if _fitted[key] is None:
        tried = [n for n in (count * 2**i for i in range(7)) if n <= min(64, trial.train.batch_size)]
        most = max([n for n in tried if trial.train.batch_size % n == 0] or [count])
        raise ConfigError(f"ray.fit_device_gib={gib} is invalid for model={trial.preset}: no FSDP worker count from "
                          f"ray.workers_per_trial={count} up to 64 fits, and on {most} its "
                          f"{estimate(trial, most, 'fsdp', dtype).breakdown()}, above the {HEADROOM:.0%} of {gib} GiB "
                          "planned for; raise it, or lower train.batch_size or train.seq_len")
    return _fitted[key]


def requested(ray_cfg: dict[str, Any]) -> tuple[float, float]:
    """(CPUs, GPUs) per trial (per worker of a trial of several), each checked for a shape Ray accepts."""
    cpus, gpus = _number(ray_cfg, "cpus_per_trial", 1), _number(ray_cfg, "gpus_per_trial", 0)
    require(cpus > 0, "ray.cpus_per_trial", ray_cfg.get("cpus_per_trial"), "must be > 0 (it is also the trial's torch threads)")
    # Ray shares a device between trials only as a fraction of one; above 1, whole devices.
    require(gpus <= 1 or gpus.is_integer(), "ray.gpus_per_trial", ray_cfg.get("gpus_per_trial"),
            "must be a fraction of one GPU (e.g. 0.25) or a whole number")
    return cpus, gpus


def check_local(ray_cfg: dict[str, Any]) -> None:
    """Before anything is written: a request the local Ray (ray.address=null) could never meet,
    or a local Ray that could not start as promised."""
    cpus, gpus = requested(ray_cfg)
    num_cpus = ray_cfg.get("num_cpus")
    # 0 starts a Ray no trial fits on, found by check_cluster only once the study is written.
    whole = isinstance(num_cpus, int | float) and not isinstance(num_cpus, bool) and float(num_cpus).is_integer()
    require(num_cpus is None or (whole and num_cpus >= 1), "ray.num_cpus", num_cpus,
            "must be a whole number >= 1, or null for all of this machine's cores")
    _number(ray_cfg, "num_gpus", 0)
    listen_setting(ray_cfg)
    if ray_cfg.get("address"):
        return  # another cluster: checked against its nodes once connected
    check_local_start(ray_cfg)
    have_cpus = ray_cfg.get("num_cpus") or len(os.sched_getaffinity(0))
    where = "ray.num_cpus" if ray_cfg.get("num_cpus") else "this machine's cores"
    require(cpus <= have_cpus, "ray.cpus_per_trial", ray_cfg.get("cpus_per_trial"),
            f"the local Ray has {have_cpus:g} CPUs ({where}), so no trial could ever start; at most {have_cpus:g}")
    check_local_workers(ray_cfg, workers(ray_cfg))


def check_local_workers(ray_cfg: dict[str, Any], count: int) -> None:
    """The trial of `count` workers (the plan's largest) against the local Ray's CPUs and GPUs."""
    if ray_cfg.get("address"):
        return
    cpus, gpus = requested(ray_cfg)
    have_cpus = ray_cfg.get("num_cpus") or len(os.sched_getaffinity(0))
    where = "ray.num_cpus" if ray_cfg.get("num_cpus") else "this machine's cores"
    key, value, needs = _count_key(ray_cfg, count)
    require(count * cpus <= have_cpus, key, value,
            f"{needs}{count} workers x ray.cpus_per_trial={cpus:g} need {count * cpus:g} CPUs and the local Ray has {have_cpus:g} CPUs "
            f"({where}), so no trial could ever start; at most {int(have_cpus // cpus)}")
    if gpus > 0:
        have_gpus = ray_cfg.get("num_gpus")
        if have_gpus is None:
            import torch  # only for GPU sweeps, which import it anyway

            have_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
            where = "torch.cuda.is_available() is False" if not have_gpus else f"torch sees {have_gpus}"
        else:
            where = f"ray.num_gpus={have_gpus:g}"
        require(gpus <= have_gpus, "ray.gpus_per_trial", ray_cfg.get("gpus_per_trial"),
                f"the local Ray has {have_gpus:g} GPUs ({where}), so no trial could ever start; "
                "use 0 for CPU trials, or a cluster with GPUs (ray.address=...)")
        require(count * gpus <= have_gpus, key, value,
                f"{needs}{count} workers x ray.gpus_per_trial={gpus:g} need {count * gpus:g} GPUs and the local Ray has {have_gpus:g} GPUs "
                f"({where}), so no trial could ever start; at most {int(have_gpus // gpus)}")


def _count_key(ray_cfg: dict[str, Any], count: int) -> tuple[str, Any, str]:
    """(key, value, what it asks for): where a worker count comes from, for the line refusing it."""
    if ray_cfg.get("fit_device_gib") is None:
        return "ray.workers_per_trial", count, ""
    return "ray.fit_device_gib", ray_cfg["fit_device_gib"], "its largest trial's "


def check_cluster(ray_cfg: dict[str, Any], count: int | None = None) -> None:
    """After connecting: some live node must have the CPUs and the GPUs of one trial, and the
    nodes together the workers of the largest (count; default ray.workers_per_trial)."""
    import ray

    cpus, gpus = requested(ray_cfg)
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    count = workers(ray_cfg) if count is None else count
    if any(node.get("CPU", 0) >= cpus and node.get("GPU", 0) >= gpus for node in nodes):
        # A trial's workers may spread over nodes, each taking one worker's share where it fits.
        room = sum(min(node.get("CPU", 0) // cpus, node.get("GPU", 0) // gpus if gpus else float("inf")) for node in nodes)
        if room < count:
            key, value, needs = _count_key(ray_cfg, count)
            head = f"{needs}{count} workers do not fit: " if needs else ""
            raise ConfigError(f"{key}={value!r} is invalid: {head}the cluster's nodes hold {room:g} workers of "
                              f"{cpus:g} CPUs and {gpus:g} GPUs each, so no trial could ever start; at most {room:g}")
        return
    sizes = ", ".join(sorted({f"{n.get('CPU', 0):g} CPUs + {n.get('GPU', 0):g} GPUs" for n in nodes})) or "none alive"
    cluster = f"the Ray cluster at {ray_cfg.get('address')}" if ray_cfg.get("address") else "the local Ray"
    if not any(n.get("CPU", 0) >= cpus for n in nodes):
        given = f"ray.cpus_per_trial={ray_cfg.get('cpus_per_trial')!r}"
    elif not any(n.get("GPU", 0) >= gpus for n in nodes):
        given = f"ray.gpus_per_trial={ray_cfg.get('gpus_per_trial')!r}"
    else:  # each is met somewhere, never both on one node
        given = f"ray.cpus_per_trial={ray_cfg.get('cpus_per_trial')!r} ray.gpus_per_trial={ray_cfg.get('gpus_per_trial')!r}"
    raise ConfigError(f"{given} is invalid: no node of {cluster} has {cpus:g} CPUs and {gpus:g} GPUs for one trial, "
                      f"so no trial could ever start (its nodes: {sizes})")
