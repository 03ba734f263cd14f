"""Where a sweep's CPU time goes: CPU seconds by process role, and inside the trial workers by
thread, read from /proc once a second while the sweep runs.

The sweep's processes are the driver's descendants (a local Ray's GCS, raylet, agents and
workers, and each trial's wandb-core). Each (pid, tid) keeps the largest utime + stime seen;
a thread that ends between two samples loses at most its last second, which the one-second
cadence accepts (a faster cadence costs the measured sweep a few % of a core).

Linux only (/proc); elsewhere the accounts stay empty.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# (substring of the command line, role), first match wins.
ROLES = (
    # Workers first: a worker's command line names the raylet's socket (.../sockets/raylet).
    ("ray::", "trial workers"),
    ("default_worker.py", "trial workers"),
    ("gcs_server", "ray: gcs_server"),
    ("/raylet", "ray: raylet"),
    ("dashboard/agent.py", "ray: dashboard agent"),
    ("runtime_env/agent", "ray: runtime-env agent"),
    ("dashboard/dashboard.py", "ray: dashboard head"),
    ("log_monitor.py", "ray: log monitor"),
    ("monitor.py", "ray: autoscaler monitor"),
    ("wandb-core", "wandb-core"),
    ("sweeper/runtime/reaper.py", "reaper"),  # started as a script (cluster.py), not with -m
)


def role(cmdline: str, is_root: bool) -> str:
    if is_root:
        return "driver"
    for needle, name in ROLES:
        if needle in cmdline:
            return name
    return "other: " + (cmdline.split("\0", 1)[0].rsplit("/", 1)[-1][:40] or "?")


def _ticks(stat: str) -> tuple[str, int]:
    """(thread name, utime + stime) from a /proc stat line (the name may hold spaces)."""
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    return name, int(fields[11]) + int(fields[12])


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry.name))
    return children


def descendants(root: int) -> list[int]:
    children, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


class CpuAccount:
    """The CPU seconds of a process tree, by role and (for trial workers) by thread name."""

    def __init__(self, root: int):
        self.root = root
        self.roles: dict[int, str] = {}
        self.ticks: dict[tuple[int, int], int] = {}
        self.thread_names: dict[tuple[int, int], str] = {}

    def sample(self, pids: list[int]) -> None:
        for pid in pids:
            if pid not in self.roles:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if not cmd:  # a zombie, or a process still exec'ing: ask again next time
                    continue
                self.roles[pid] = role(cmd, pid == self.root)
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    name, ticks = _ticks(Path(f"/proc/{pid}/task/{tid}/stat").read_text())
                except (OSError, ValueError):
                    continue
                key = (pid, int(tid))
                if ticks >= self.ticks.get(key, 0):
                    self.ticks[key] = ticks
                    self.thread_names[key] = "main" if int(tid) == pid else name

    def by_role(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for (pid, _), ticks in self.ticks.items():
            out[self.roles.get(pid, "?")] += ticks / TICK
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def worker_threads(self) -> dict[str, float]:
        """Trial workers' CPU seconds by thread name. Tune trains in a thread of its own, which
        inherits the worker's name (ray::...), as do W&B's Python threads; "main" is the
        worker's main thread, which waits for results; the rest are Ray's core-worker threads."""
        out: dict[str, float] = defaultdict(float)
        for key, ticks in self.ticks.items():
            if self.roles.get(key[0]) == "trial workers":
                out[self.thread_names[key]] += ticks / TICK
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


class TreeSampler(threading.Thread):
    """Once a second until stopped: the peak summed memory of a process tree, the root's own
    peak (its VmHWM, a high-water mark, so a once-a-second read misses nothing but the last
    second) and the tree's CPU account.

    Once a second: the sampler shares the cores with the sweep it measures (a 0.1 s cadence
    cost ~3% of a core, which the pool runs it is compared with do not pay)."""

    def __init__(self, pid: int, every: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.tree_rss_kb = 0
        self.tree_max = 0
        self.root_hwm_kb = 0
        self.cpu = CpuAccount(pid)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            pids = descendants(self.pid)
            self.tree_max = max(self.tree_max, len(pids))
            self.tree_rss_kb = max(self.tree_rss_kb, sum(status_kb(p, "VmRSS:") for p in pids))
            self.root_hwm_kb = max(self.root_hwm_kb, status_kb(self.pid, "VmHWM:"))
            self.cpu.sample(pids)
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def status_kb(pid: int, field: str) -> int:
    """A kB field of /proc/PID/status (VmRSS: now, VmHWM: the peak); 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
