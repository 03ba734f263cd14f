"""The local Ray of a sweep: reachable from this machine only, and gone within seconds of its
driver, however the driver ends (a kill -9 of the driver alone, not its process group)."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smallinit.sweeper.runtime.cluster import OWNER_VAR

from .conftest import CARD, REPO, TINY_SWEEP


def session_pids(driver_pid: int) -> list[int]:
    """Processes whose environment carries the driver's Ray owner tag (every Ray process it started)."""
    marker = f"{OWNER_VAR}={driver_pid}-".encode()
    out = []
    for proc in Path("/proc").iterdir():
        try:
            env = (proc / "environ").read_bytes()
        except (OSError, ValueError):
            continue
        if any(item.startswith(marker) for item in env.split(b"\0")):
            out.append(int(proc.name))
    return out


def family(roots: list[int]) -> dict[int, tuple[int, str]]:
    """pid -> (start time, command line) of the roots and every process below them. Ray's agents
    (ray::DashboardAgent, ray::RuntimeEnvAgent) are here although their environment, overwritten
    when they rename themselves, no longer shows the tag."""
    parent, seen = {}, {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        parent[int(proc.name)] = (int(fields[1]), int(fields[19]), cmd)
    todo = [p for p in roots if p in parent]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen[pid] = parent[pid][1:]
            todo.extend(p for p, (pp, _, _) in parent.items() if pp == pid)
    return seen


def still_running(recorded: dict[int, tuple[int, str]]) -> list[str]:
    """The recorded processes still alive (same pid, same start time, not a zombie), by command line."""
    left = []
    for pid, (start, cmd) in recorded.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[19]) == start and fields[0] != "Z":
            left.append(f"{pid} {cmd[:60]}")
    return left


def listening_addresses(pids: list[int]) -> dict[int, list[str]]:
    """pid -> the local addresses of its listening TCP sockets, read from /proc (no psutil, no ss)."""
    listening = {}  # socket inode -> address
    for table, width in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_ip = fields[1].split(":")[0]
            raw = b"".join(bytes.fromhex(hex_ip[i:i + 8])[::-1] for i in range(0, 2 * width, 8))
            ip = ipaddress.ip_address(raw)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
                ip = ip.ipv4_mapped
            listening[fields[9]] = str(ip)
    out = {}
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        addrs = [listening[link[8:-1]] for link in links if link.startswith("socket:[") and link[8:-1] in listening]
        if addrs:
            out[pid] = addrs
    return out


@pytest.mark.slow  # make test stays under 10 min on 2 cores; CI runs it after
def test_a_local_cluster_listens_on_loopback_only_and_dies_within_seconds_of_a_killed_driver(tmp_path, data_cache):
    args = [*CARD, "train.max_tokens=8192", "train.eval_every=16", "train.probe_every=0", "wandb.mode=disabled",
            "name=lifetime"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), "SMALLINIT_CACHE": str(data_cache)}
    driver = subprocess.Popen([sys.executable, str(REPO / "sweep.py"), "-m", *TINY_SWEEP, *args], cwd=tmp_path,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        trials = tmp_path / "sweeps" / "lifetime" / "trials"
        deadline = time.time() + 300
        while not list(trials.glob("*/metrics.jsonl")) and time.time() < deadline and driver.poll() is None:
            time.sleep(0.2)  # a trial is training: GCS, raylet, agents and workers are all up
        pids = session_pids(driver.pid)
        assert len(pids) >= 4, "the sweep's Ray processes were not found (or the sweep ended early)"
        addrs = listening_addresses([driver.pid, *pids])
        assert len(addrs) >= 3, addrs  # at least the GCS, the raylet and a worker listen
        assert {a for v in addrs.values() for a in v} == {"127.0.0.1"}, addrs

        ray_family = family(pids)
        agents = [cmd for _, cmd in ray_family.values() if "Agent" in cmd]
        assert len(agents) >= 2, sorted(cmd[:60] for _, cmd in ray_family.values())  # the dashboard and runtime-env agents

        os.kill(driver.pid, signal.SIGKILL)  # the driver alone: its Ray must notice by itself
        killed = time.time()
        driver.wait()
        while (session_pids(driver.pid) or still_running(ray_family)) and time.time() - killed < 60:
            time.sleep(0.2)
        left, took = [*map(str, session_pids(driver.pid)), *still_running(ray_family)], time.time() - killed
        assert not left and took < 6, f"{len(left)} Ray processes left {took:.1f} s after the driver died: {left}"
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        for pid in session_pids(driver.pid):  # only this test's own processes carry its driver's tag
            os.kill(pid, signal.SIGKILL)
        for line in still_running(ray_family if "ray_family" in locals() else {}):
            os.kill(int(line.split()[0]), signal.SIGKILL)
