"""The Ray cluster a sweep runs on: check ray.address is reachable, connect or start a local
Ray, and stop what this sweep started.

A local cluster (ray.address unset) serves this driver alone: it listens on 127.0.0.1 only
(ray.listen=loopback; where Ray's internals no longer allow that, it does not start, unless
ray.listen=all), and its processes end within seconds of the driver, however the driver ends
(reaper.py)."""

from __future__ import annotations

import glob
import logging
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from smallinit.core.errors import ConfigError, first_line, require
from smallinit.trainer.machine.host_memory import worker_env

from . import ray_internals

log = logging.getLogger("smallinit.sweep")

# Every process of a local cluster inherits this variable, set to a value unique to the
# driver: reaper.py finds the processes to stop by it, and none of anyone else's.
OWNER_VAR = "SMALLINIT_RAY_OWNER"
_reaper: subprocess.Popen | None = None

# ray.listen: where a local Ray listens. loopback = 127.0.0.1 only; all = Ray's own default
# (the node's address, reachable from other machines).
LISTEN = ("loopback", "all")
# The longest path of an AF_UNIX socket: sun_path less its NUL (Ray checks the same bound,
# ray._private.utils.validate_socket_filepath).
SOCKET_PATH_MAX = 103 if sys.platform == "darwin" else 107


def check_reachable(address: str) -> None:
    """Fail in seconds, not minutes: ray.init retries an unreachable GCS for a long time.
    "auto" is resolved as ray.init resolves it (ray_internals.auto_address), but ray.init
    still gets "auto": only then does Ray turn on token authentication from a token file alone."""
    import socket

    given = repr(address)
    if address == "auto":
        try:
            address = ray_internals.auto_address()
            given = f"'auto' (Ray found {address})"
        except ray_internals.RayInternalsMoved as e:
            log.warning("%s; ray.init(address='auto') will look for the cluster itself", e)
            return
        except ConnectionError as e:
            raise ConfigError(f"ray.address='auto' is invalid: no running Ray cluster found ({e}); start one "
                              "with `ray start --head`, or leave ray.address=null for a local Ray") from None
    if address.startswith("ray://"):
        # Under Ray Client (ray[client], not installed) Tune runs the tuner as an actor on the
        # head (ray/tune/tuner.py, client mode), apart from the study and stop signals this
        # driver holds: the driver itself must run on a node of the cluster.
        raise ConfigError(f"ray.address={given} is invalid: Ray Client (ray://) is not supported; run the "
                          "sweep on a node of the cluster with ray.address=auto or ray.address=<head-ip>:6379")
    hostport = address.rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=5) as conn:
            answer = _grpc_answer(conn)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"ray.address={given} is invalid: cannot reach {hostport} ({e}); start a cluster with "
            "`ray start --head`, or leave ray.address=null for a local Ray"
        ) from None
    if answer is not None:
        # Something else listens there (the dashboard's 8265, a web server): ray.init would retry
        # it for minutes, after the study and the trial folders were written.
        said = f"it answered {answer!r}" if answer else "it sent nothing in 5 s"
        raise ConfigError(f"ray.address={given} is invalid: {hostport} is not a Ray head's GCS ({said}); give the "
                          "address `ray start --head` prints (port 6379 unless --port; 8265 is the dashboard)")


# What a gRPC (HTTP/2) server answers a client's connection preface with: a SETTINGS frame, whose
# 9-byte header has type 0x04 at offset 3 (RFC 9113, sections 3.4 and 4.1). Ray's GCS is gRPC.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _grpc_answer(conn) -> bytes | None:
    """None if the peer answers as a gRPC server, else what it sent (b"" for nothing). Under
    RAY_USE_TLS the GCS expects a TLS handshake first: not probed."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return None
    conn.settimeout(5)
    conn.sendall(_HTTP2_PREFACE)
    data = b""
    try:
        while len(data) < 9:
            chunk = conn.recv(9 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return None if len(data) == 9 and data[3] == 0x04 else data


def allocator_env(ray_cfg: dict[str, Any]) -> dict[str, str]:
    """CPU trials' workers get the allocator setting at process start (trainer/machine/host_memory.py):
    Tune trains on a thread of its own, which a later mallopt would not move to the main arena.
    GPU trials keep glibc's defaults: their host side allocates little, and one arena would
    make the host threads CUDA and data loading use take turns."""
    return {} if float(ray_cfg.get("gpus_per_trial") or 0) > 0 else worker_env()


def connect_ray(ray_cfg: dict[str, Any]) -> bool:
    """Connect to ray.address, or start a local Ray; False if this process already had one."""
    import ray

    if ray.is_initialized():
        return False
    address = ray_cfg.get("address")
    # Trials keep the working directory they were launched from (Tune would chdir into its
    # own trial folder); set for every worker of the job, on a remote cluster too.
    os.environ["RAY_CHDIR_TO_TRIAL_DIR"] = "0"
    kwargs = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False,
              "runtime_env": {"env_vars": {"RAY_CHDIR_TO_TRIAL_DIR": "0", **allocator_env(ray_cfg)}}}
    if not address:
        _start_local(ray_cfg, kwargs)
        return True
    try:
        ray.init(address=address, **kwargs)
    except Exception as e:
        raise ConfigError(f"ray.address={address!r} is invalid: could not connect ({first_line(e)}); "
                          f"{_connect_hint(address)}") from None
    return True


def check_local_start(ray_cfg: dict[str, Any]) -> None:
    """What would keep this driver from starting its local Ray as promised, found before
    anything is written: ray.listen, a Ray whose loopback-only setting is not vouched for, and
    Ray's socket paths under its temp folder."""
    if listen_setting(ray_cfg) == "loopback":
        try:
            ray_internals.check_version()  # its names, which need `import ray`, when it starts
        except ray_internals.RayInternalsMoved as e:
            raise ConfigError(_loopback_refused(e)) from None
    var, base = ray_temp_base()
    # A head's sockets are <base>/ray/session_<date to the microsecond>_<pid>/sockets/<name>, named
    # in the process that calls ray.init (ray/_private/node.py): this one. plasma_store is the longest.
    session = f"session_0000-00-00_00-00-00_000000_{os.getpid()}"
    longest = len(os.path.join(base, "ray", session, "sockets", "plasma_store").encode())
    if longest > SOCKET_PATH_MAX:
        size = len(base.encode())
        raise ConfigError(
            f"{_named(var, base)} is invalid: it is {size} bytes, which makes Ray's socket paths "
            f"{longest} bytes where a Unix socket path holds at most {SOCKET_PATH_MAX}; set RAY_TMPDIR to a folder "
            f"of at most {size - longest + SOCKET_PATH_MAX} bytes (e.g. /tmp)")
    existing = next(q for q in (Path(base), *Path(base).absolute().parents) if q.exists())  # Ray makes the rest
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{_named(var, base)} is invalid: it is not a folder this user can write, and the local Ray "
                          "keeps its sessions there; point it at one (e.g. /tmp)")


def listen_setting(ray_cfg: dict[str, Any]) -> str:
    """ray.listen, checked: where a local Ray listens (LISTEN)."""
    listen = ray_cfg.get("listen", "loopback")
    require(listen in LISTEN, "ray.listen", listen, f"one of {list(LISTEN)}")
    return listen


def ray_temp_base() -> tuple[str, str]:
    """(the variable that names it or "", the folder) under which a local Ray puts ray/, as Ray
    picks it (ray._common.utils.get_default_system_temp_dir): RAY_TMPDIR, TMPDIR on Linux, /tmp."""
    for var in ("RAY_TMPDIR", "TMPDIR"):
        if var in os.environ and (var == "RAY_TMPDIR" or sys.platform.startswith("linux")):
            return var, os.environ[var]
    return "", "/tmp"


def _named(var: str, base: str) -> str:
    return f"{var}={base!r}" if var else f"Ray's temp folder {base!r}"


def _loopback_refused(e: ray_internals.RayInternalsMoved) -> str:
    return (f"ray.listen='loopback' cannot be applied, so the local Ray was not started: {e}; set ray.listen=all "
            "to start it listening on every interface of this machine, or run on a cluster (ray.address=...)")


def _start_local(ray_cfg: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """Start this driver's own Ray, on 127.0.0.1 only unless ray.listen=all; ConfigError in
    one line, with Ray's reason, if it does not start."""
    import ray

    check_local_start(ray_cfg)
    if listen_setting(ray_cfg) == "loopback":
        try:
            ray_internals.listen_on_loopback_only()
        except ray_internals.RayInternalsMoved as e:
            raise ConfigError(_loopback_refused(e)) from None
    _start_reaper()
    try:
        # "local": a new Ray for this driver, even where RAY_ADDRESS or a `ray start --head`
        # on this machine would make ray.init() join that cluster instead.
        ray.init(address="local", num_cpus=ray_cfg.get("num_cpus"), num_gpus=ray_cfg.get("num_gpus"), **kwargs)
    except Exception as e:
        _release_reaper()  # it stops whatever of this Ray did start
        raise ConfigError(start_failure(e)) from None


# A line Ray's processes logged (glog: "[date time level pid tid] (process) file.cc:line: text"),
# of level E(rror) or C(heck failed), which Ray quotes after the first line of its exception.
_LOGGED = re.compile(r"^\[[^\]]* [EC] \d+ \d+\]\s+(?:\(\w+\)\s+)?\S+:\d+:\s*(.*)$")


def start_failure(e: BaseException) -> str:
    """One line for a local Ray that did not start: Ray's reason (the last error its processes
    logged, where it quotes one), where its logs are, and what to do."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
    logged = [m.group(1) for line in lines[1:] if (m := _LOGGED.match(line))]
    reason = lines[0]
    if logged:  # "Failed to start GCS.  Last 1 lines of error files:" then the lines
        said = logged[-1].split("Check failed:", 1)[-1].strip()
        sentences = re.split(r"(?<=\.) ", said)  # Ray's lines run on with advice of its own
        reason = f"{lines[0].split('.')[0]}: {' '.join(sentences[:2])}"
    var, base = ray_temp_base()
    sessions = sorted(glob.glob(os.path.join(glob.escape(base), "ray", f"session_*_{os.getpid()}", "logs")))
    if sessions:
        advice = f"Ray's logs are in {sessions[-1]}"
    elif isinstance(e, OSError):
        advice = f"{_named(var, base)} must be a folder this user can write, with free space"
    else:
        advice = "rerun, or run on a cluster with ray.address=auto"
    return f"the local Ray (ray.address=null) did not start: {reason}; {advice}"


def _connect_hint(address: str) -> str:
    """What to try after a failed connect. Ray 2.60 clusters use token authentication where
    ~/.ray/auth_token exists, but a driver given an explicit address turns it on only with
    RAY_AUTH_MODE=token, and then fails after 24 s of retries with no word of tokens."""
    if address != "auto" and os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return ("if the cluster uses token authentication, set RAY_AUTH_MODE=token here and the cluster's "
                "token in ~/.ray/auth_token or RAY_AUTH_TOKEN")
    return "start one with `ray start --head`, or leave ray.address=null for a local Ray"


def stop_ray() -> None:
    """Shut down (or disconnect from) the Ray this sweep started, now rather than at exit:
    Ray's exit hook first sleeps 0.5 s for log lines this driver does not forward."""
    import ray

    # ray.shutdown() stops the autoscaler monitor after the GCS, and the monitor's SIGTERM
    # handler then waits on the dead GCS until Ray's 1 s grace period runs out (1.4 s of the
    # shutdown's 1.5 s here). A local cluster's monitor holds no state: stop it first.
    try:
        for process in ray_internals.local_monitor_processes():
            process.kill()
            process.wait(timeout=5)
    except ray_internals.RayInternalsMoved as e:
        log.warning("%s; shutting Ray down the slow way", e)
    except Exception:  # noqa: BLE001 - a speed-up only: whatever went wrong, shut down the slow way
        pass
    ray.shutdown()
    _release_reaper()


class ClusterWatch:
    """Whether the connected cluster still answers: its GCS refusing connections for
    GONE_AFTER_S in a row (`ray stop` on the head, a head that died). Without this the driver
    waits on the dead cluster until Ray's core worker gives up and exits 1 (60 s, no results
    table, a page of Ray's lines)."""

    GONE_AFTER_S = 5.0

    def __init__(self, gcs_address: str):
        self.address = gcs_address
        host, _, port = gcs_address.rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)
        self.failing_since: float | None = None

    @classmethod
    def of_connected(cls) -> ClusterWatch | None:
        import ray

        try:
            return cls(ray.get_runtime_context().gcs_address)
        except (AttributeError, ValueError):  # an address of another form: not watched
            return None

    def __call__(self) -> str | None:
        """Why the cluster counts as gone, or None while it answers (or only briefly did not)."""
        import socket
        import time

        try:
            socket.create_connection((self.host, self.port), timeout=1).close()
            self.failing_since = None
            return None
        except OSError as e:
            now = time.monotonic()
            self.failing_since = self.failing_since or now
            if now - self.failing_since < self.GONE_AFTER_S:
                return None
            return f"the Ray cluster at {self.address} stopped answering ({first_line(e)})"


def local_ray_lost() -> bool:
    """Whether a process of the local Ray this driver started has ended: a stop signal reached
    Ray's own processes too (a kill of the whole process group or cgroup, as Slurm and systemd
    send). Their log monitor and dashboard exit at once (measured on Ray 2.60); the raylet ~10 s
    later, and Tune's stop then waits on it. False on a cluster this driver only joined, or when
    Ray's internals moved."""
    try:
        heads = ray_internals.local_head_processes()
    except ray_internals.RayInternalsMoved:
        return False
    return any(p.poll() is not None for processes in heads.values() for p in processes)


def _start_reaper() -> None:
    """Tag this process's environment (Ray's processes inherit it) and start reaper.py,
    which stops every tagged process once this driver is gone."""
    global _reaper
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    os.environ[OWNER_VAR] = tag
    script = Path(__file__).with_name("reaper.py")
    # Its stdin is a pipe whose other end only this process holds (not inherited: PEP 446),
    # so it reads EOF when this process ends, kill -9 included. Its own session keeps it out
    # of a kill of this process group; its environment drops the tag so it never matches itself.
    env = {k: v for k, v in os.environ.items() if k != OWNER_VAR}
    _reaper = subprocess.Popen([sys.executable, "-I", "-S", str(script), OWNER_VAR, tag, str(os.getpid())],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True, env=env)


def _release_reaper() -> None:
    """After ray.shutdown(): let the reaper stop whatever Ray left running (its agents
    outlive a shutdown too) and go; it needs no waiting for."""
    global _reaper
    if _reaper is not None:
        os.environ.pop(OWNER_VAR, None)  # what this process starts from now on is not Ray's
        _reaper.stdin.close()
        _reaper = None


def trial_resources(ray_cfg: dict[str, Any], workers: int) -> dict[str, float]:
    """What a trial of `workers` workers (its TrialSpec's) asks Ray for. A trial of several is a
    Tune trial that only builds and waits on its TorchTrainer: the workers ask for the CPUs and
    GPUs (its ScalingConfig)."""
    if workers > 1:
        # Tune refuses an empty request: one byte of memory stands in for "nothing".
        return {"cpu": 0.0, "gpu": 0.0, "memory": 1.0}
    return {"cpu": float(ray_cfg.get("cpus_per_trial") or 1), "gpu": float(ray_cfg.get("gpus_per_trial") or 0)}


def trial_slots(ray_cfg: dict[str, Any], max_concurrent: int | None, workers: int) -> int | None:
    """How many trials Tune may run at once, `workers` the largest trial's. Trials of several
    workers ask Tune for nothing (trial_resources), so Tune would start them all and their worker
    groups would wait on each other: they are capped at how many of the largest the connected
    cluster's CPUs and GPUs hold, so that trials that do not fit run one after the other."""
    if workers == 1:
        return max_concurrent
    import ray

    have = ray.cluster_resources()
    cpus, gpus = float(ray_cfg.get("cpus_per_trial") or 1), float(ray_cfg.get("gpus_per_trial") or 0)
    fits = int(have.get("CPU", 0) // (workers * cpus))
    if gpus > 0:
        fits = min(fits, int(have.get("GPU", 0) // (workers * gpus)))
    return max(1, min(fits, max_concurrent or fits))
