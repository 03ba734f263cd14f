"""Every Ray internal the sweeper relies on, in one place, checked against the installed Ray.

Ray gives no public way to do these, and each is only a speed-up or a fast error: if Ray
moves one, the sweep still works (the slow way), `check()` says so in one line, and
tests/test_ray_internals.py fails on the upgrade.
"""

from __future__ import annotations

import importlib
import os

# The Ray these internals were read from (ray/_private/worker.py, node.py, services.py, ray_constants.py).
CHECKED_AGAINST = "2.60.0"

# Each dotted name this module uses; check() and the test resolve every one. Node's
# all_processes is set in __init__, so only a live node shows it: the test starts one.
INTERNALS = (
    "ray._private.worker._global_node",
    "ray._private.node.Node.is_head",
    "ray._private.services.ProcessInfo.process",
    "ray._private.ray_constants.PROCESS_TYPE_MONITOR",
    "ray._private.services.canonicalize_bootstrap_address",
    "ray._common.utils.get_ray_address_file",
    "ray._private.ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR",
    "ray._private.ray_constants.ENABLE_RAY_CLUSTER",
)


class RayInternalsMoved(RuntimeError):
    pass


def resolve(dotted: str):
    """Import the longest importable module prefix of `dotted`, then getattr the rest."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module named {parts[0]!r}")


def check() -> None:
    """RayInternalsMoved, in one line, if any internal is gone from the installed Ray."""
    import ray

    for dotted in INTERNALS:
        try:
            resolve(dotted)
        except (ImportError, AttributeError):
            raise RayInternalsMoved(
                f"ray {ray.__version__} has no {dotted} (sweeper/ray_internals.py was checked "
                f"against ray {CHECKED_AGAINST}): update it for this Ray"
            ) from None


def listen_on_loopback_only() -> None:
    """Make the local cluster this process is about to start bind 127.0.0.1 only.

    Ray has no public switch. It binds its GCS, raylets, workers and agents to the node's IP,
    and to 127.0.0.1 only when that IP is the loopback, which it is where "clusters" are off
    (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, the default on macOS and Windows;
    ray._private.services.get_node_ip_address). The variable is read when ray_constants is
    imported: set for the processes Ray starts, and on the module, which may be imported already."""
    check()
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def local_monitor_processes() -> list:
    """The autoscaler monitor processes (Popen) of the Ray head this process started;
    empty when it only connected to a cluster."""
    from ray._private import ray_constants

    return local_head_processes().get(ray_constants.PROCESS_TYPE_MONITOR, [])


def local_head_processes() -> dict[str, list]:
    """Process type -> the processes (Popen) of that type of the Ray head this process started
    (GCS, raylet, monitor, log monitor, dashboard); empty when it only connected to a cluster."""
    check()
    from ray._private import worker

    # Read at call time: ray.init() rebinds the module global.
    node = worker._global_node
    if node is None or not node.is_head():
        return {}
    return {kind: [info.process for info in infos] for kind, infos in node.all_processes.items()}


def auto_address() -> str:
    """The host:port that ray.init(address="auto") connects to, found as Ray finds it:
    RAY_ADDRESS, else the address file of the newest `ray start --head` under Ray's temp dir
    ($RAY_TMPDIR/ray, else $TMPDIR/ray, else /tmp/ray), else a Ray head running on this
    machine. ConnectionError, in one line naming the file read, when there is none."""
    check()
    from ray._common.utils import get_ray_address_file
    from ray._private.services import canonicalize_bootstrap_address

    try:
        found = canonicalize_bootstrap_address("auto")
    except ConnectionError:
        found = None
    if not found:
        raise ConnectionError(f"RAY_ADDRESS is unset, {get_ray_address_file(None)} does not exist "
                              "and no Ray head runs on this machine")
    return found
