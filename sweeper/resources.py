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

from core.errors import ConfigError, require

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
    count = workers(ray_cfg)
    require(count * cpus <= have_cpus, "ray.workers_per_trial", count,
            f"{count} workers x ray.cpus_per_trial={cpus:g} need {count * cpus:g} CPUs and the local Ray has {have_cpus:g} CPUs "
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
        require(count * gpus <= have_gpus, "ray.workers_per_trial", count,
                f"{count} workers x ray.gpus_per_trial={gpus:g} need {count * gpus:g} GPUs and the local Ray has {have_gpus:g} GPUs "
                f"({where}), so no trial could ever start; at most {int(have_gpus // gpus)}")


def check_cluster(ray_cfg: dict[str, Any]) -> None:
    """After connecting: some live node must have the CPUs and the GPUs of one trial."""
    import ray

    cpus, gpus = requested(ray_cfg)
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    count = workers(ray_cfg)
    if any(node.get("CPU", 0) >= cpus and node.get("GPU", 0) >= gpus for node in nodes):
        # A trial's workers may spread over nodes, each taking one worker's share where it fits.
        room = sum(min(node.get("CPU", 0) // cpus, node.get("GPU", 0) // gpus if gpus else float("inf")) for node in nodes)
        if room < count:
            raise ConfigError(f"ray.workers_per_trial={count} is invalid: the cluster's nodes hold {room:g} workers of "
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
