"""Every Ray internal the sweeper relies on, in one place, checked against the installed Ray.

Ray gives no public way to do these. Most are a speed-up or a fast error: if Ray moves one,
the sweep still works (the slow way) and `check()` says so in one line. One is a safety
property: a local Ray kept to 127.0.0.1. Where that cannot be applied the local Ray is not
started at all (sweeper/runtime/cluster.py), unless ray.listen=all says it may listen on every interface.
A Ray outside SUPPORTED counts as moved: names that still resolve may no longer do what they did.
tests/test_ray_internals.py fails on the upgrade, and holds SUPPORTED equal to pyproject.toml's range.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os

from packaging.specifiers import SpecifierSet
from packaging.version import Version

# The Ray these internals were read from (ray/_private/worker.py, node.py, services.py, ray_constants.py).
CHECKED_AGAINST = "2.60.0"
# The Rays they are vouched for: pyproject.toml's ray[tune] range, exactly.
SUPPORTED = ">=2.60,<2.61"

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


def installed_version() -> str:
    """The installed Ray's version, read from its metadata: no `import ray` (~1 s)."""
    return importlib.metadata.version("ray")


def check_version() -> None:
    """RayInternalsMoved, in one line, if the installed Ray is outside SUPPORTED."""
    installed = installed_version()
    if Version(installed) not in SpecifierSet(SUPPORTED):
        raise RayInternalsMoved(f"ray {installed} is installed and sweeper/runtime/ray_internals.py is checked "
                                f"against ray{SUPPORTED} only (pip install 'ray[tune]{SUPPORTED}')")


def check() -> None:
    """RayInternalsMoved, in one line, if the installed Ray is outside SUPPORTED or any
    internal is gone from it."""
    check_version()
    for dotted in INTERNALS:
        try:
            resolve(dotted)
        except (ImportError, AttributeError):
            raise RayInternalsMoved(
                f"ray {installed_version()} has no {dotted} (sweeper/runtime/ray_internals.py was checked "
                f"against ray {CHECKED_AGAINST}): update it for this Ray"
            ) from None


def listen_on_loopback_only() -> None:
    """Make the local cluster this process is about to start bind 127.0.0.1 only.

    Ray has no public switch. It binds its GCS, raylets, workers and agents to the node's IP,
    and to 127.0.0.1 only when that IP is the loopback, which it is where "clusters" are off
    (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, the default on macOS and Windows;
    ray._private.services.get_node_ip_address). The variable is read when ray_constants is
    imported: set for the processes Ray starts, and on the module, which may be imported already.
    RayInternalsMoved, with nothing changed, if that cannot be relied on."""
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
