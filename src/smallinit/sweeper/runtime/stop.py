"""How the driver stops on SIGINT / SIGTERM, and the exit status it ends with.

    0        every trial of this run finished (COMPLETE or PRUNED)
    1        a refusal (one `error:` line), an aborted sweep, or a trial of this run failed
    130/143  stopped by SIGINT / SIGTERM (128 + the signal, as a shell reports it), after a
             clean stop: running trials are stopped, results.parquet lists them INTERRUPTED,
             and rerunning the same command resumes them from their checkpoints.

Why our own handlers rather than Tune's: Tune's SIGINT handler ends `fit()` as if the run
had finished (the caller cannot tell) and logs a `Tuner.restore(...)` hint that does not
apply here (the rerun is the resume); and `ray.init` sets SIGTERM to `sys.exit(15)`, which
unwinds the driver mid-step without writing the results table. So both signals come here:
inside Tune's loop they are handed to Tune's own stop (its SIGUSR1 handler, which it always
installs), anywhere else they unwind the driver as a KeyboardInterrupt; a second signal
stops at once. Signal handlers are process-wide, hence the module-level state.

A scheduler often signals every process of the job (Slurm's scancel and systemd signal the
whole cgroup; a shell's `kill -- -PGID` the process group): Ray's own processes then exit
too, and Tune's stop waits on them until Ray's core worker gives up and exits 1 (60 s). So
while Tune stops, a watcher polls the local Ray's processes; once one is gone, the sweep is
recorded from the study and the trial folders (which need no Ray) and the driver exits with
the signal's status. The reaper (reaper.py) then stops whatever Ray processes are left.
A cluster that stops answering with no signal here (`ray stop` on a user's head, a head that
died) is recorded the same way, and the driver exits 1 (cluster.ClusterWatch).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

_received: int | None = None
_in_tune = False
# While Tune runs: how to record the sweep without Ray, and how to tell Ray is gone.
_without_ray: tuple[Callable[[], None], Callable[[], bool]] | None = None
POLL_S = 0.2
REDELIVER_S = 0.05

# Tune's log lines about its own stop: replaced by ours (the resume is a rerun, and the trials
# it lists as incomplete, or has no metrics for, appear in the closing summary as INTERRUPTED).
_TUNE_STOP_LINES = {"ray.tune.tune": ("Stop signal received", "Experiment has been interrupted",
                                      "Trials did not complete"),
                    "ray.tune.analysis.experiment_analysis": ("Failed to fetch metrics",)}


class _HideTuneStopLines(logging.Filter):
    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return _received is None or not str(record.msg).startswith(self.starts)


def install() -> None:
    """Route SIGINT and SIGTERM here. Call from the main thread at start; ray.init runs inside
    handlers_kept(), which keeps them."""
    if threading.current_thread() is not threading.main_thread():
        return
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    for name, starts in _TUNE_STOP_LINES.items():
        tune_log = logging.getLogger(name)
        if not any(isinstance(f, _HideTuneStopLines) for f in tune_log.filters):
            tune_log.addFilter(_HideTuneStopLines(starts))
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    if not getattr(sys.unraisablehook, "_smallinit_stop", False):
        sys.unraisablehook = _redeliver_ignored_stop(sys.unraisablehook)


def _redeliver_ignored_stop(hook):
    """A signal handler runs wherever the main thread is; if that is a place whose exceptions
    Python drops (a destructor, a weakref callback, an at-fork hook such as logging's
    `_releaseLock` when Ray starts a process), the stop's KeyboardInterrupt would be printed as
    "Exception ignored" and lost until the next check(). Instead the signal is sent to the main
    thread again a moment later, from a helper thread (from here it would land in the same place
    again), with no output: as if it had arrived then. It also wakes a blocking call."""
    def redeliver(unraisable) -> None:
        if _received is not None and isinstance(unraisable.exc_value, KeyboardInterrupt):
            threading.Thread(target=_signal_main_thread, args=(_received,), daemon=True).start()
            return
        hook(unraisable)

    redeliver._smallinit_stop = True
    return redeliver


def _signal_main_thread(signum: int) -> None:
    time.sleep(REDELIVER_S)
    signal.pthread_kill(threading.main_thread().ident, signum)


@contextlib.contextmanager
def handlers_kept():
    """Keep this module's SIGINT/SIGTERM handlers while Ray starts: ray.init sets SIGTERM to
    `sys.exit(15)`, and a TERM in the seconds before install() runs again would exit 15 with no
    table. Other signals pass to signal.signal as asked.

    Ray's core worker also installs Abseil's failure-signal handler for SIGTERM, in C, in front
    of ours: it prints a stack, passes the signal on, and arms a 3 s alarm that aborts the
    process (SIGABRT, status -6). A clean stop that takes longer (a loaded machine, a slow
    table write) then dies mid-way; so once Ray has started, SIGTERM comes straight here again."""
    real = signal.signal
    ours = {s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is _on_signal}

    def keep(signum, handler):
        if signum in ours:
            return _on_signal
        return real(signum, handler)

    signal.signal = keep
    try:
        yield
    finally:
        signal.signal = real
        for signum in ours:
            real(signum, _on_signal)  # sigaction again: in front of Abseil's handler


def check() -> None:
    """Unwind now if a stop signal came and did not unwind the driver (a second guard beside
    _redeliver_ignored_stop: the driver calls this between its steps, so no signal is lost)."""
    if _received is not None and not _in_tune:
        raise KeyboardInterrupt


def received() -> int | None:
    """The first stop signal this process received, if any."""
    return _received


def signal_name() -> str:
    return signal.Signals(_received).name if _received is not None else "an interrupt"


def resume_line() -> str:
    return f"stopped by {signal_name()}; rerun the same command to resume"


def exit_status(status: int) -> int:
    """The status to exit with: 128 + the signal after a stop signal, else `status`."""
    return 128 + _received if _received is not None else status


@contextlib.contextmanager
def tune_takes_stops(record: Callable[[], None] | None = None, ray_lost: Callable[[], bool] | None = None,
                     cluster_gone: Callable[[], str | None] | None = None):
    """While Tune's loop runs, a stop signal asks Tune to stop cleanly instead of unwinding;
    if the signal stopped Ray too (ray_lost() turns true), record() writes the sweep's results
    and the driver exits at once. Without any signal, a cluster that stops answering
    (cluster_gone() says why) is recorded the same way and the driver exits 1."""
    global _in_tune, _without_ray
    check()  # a signal before Tune's loop: Tune would not see it
    _in_tune, _without_ray = True, (record, ray_lost) if record and ray_lost else None
    if record and cluster_gone:
        threading.Thread(target=_finish_if_the_cluster_is_gone, args=(record, cluster_gone), daemon=True).start()
    try:
        yield
    finally:
        _in_tune, _without_ray = False, None


def _on_signal(signum: int, frame) -> None:
    global _received
    first = _received is None
    if first:
        _received = signum
    tune_stop = signal.getsignal(signal.SIGUSR1)  # SIG_DFL until Tune's loop installs its own
    if first and _in_tune and callable(tune_stop):
        print(f"\nstopping on {signal.Signals(signum).name}: ending the running trials; rerun the same command "
              "to resume them (send it again to stop at once)", file=sys.stderr, flush=True)
        tune_stop(signal.SIGUSR1, frame)
        if _without_ray is not None:
            threading.Thread(target=_finish_if_ray_is_lost, args=_without_ray, daemon=True).start()
        return
    raise KeyboardInterrupt


def _finish_if_ray_is_lost(record: Callable[[], None], ray_lost: Callable[[], bool]) -> None:
    """Until Tune's loop ends: once Ray is gone, record the sweep and exit with the signal's status."""
    while _in_tune:
        if ray_lost():
            _record_and_exit(f"Ray's own processes got the {signal_name()} too: recording the sweep without them",
                             record, exit_status(1))
        time.sleep(POLL_S)


def _record_and_exit(line: str, record: Callable[[], None], status: int) -> None:
    """Say why, write the sweep's results without Ray, and exit now: the main thread waits on a
    dead Ray and would not return; record() ran what the exit hooks would (the lock's release)."""
    print(line, file=sys.stderr, flush=True)
    try:
        record()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


CLUSTER_POLL_S = 1.0


def _finish_if_the_cluster_is_gone(record: Callable[[], None], cluster_gone: Callable[[], str | None]) -> None:
    """Until Tune's loop ends: once the cluster is gone, record the sweep and exit 1."""
    while _in_tune:
        why = cluster_gone()
        if why is not None and _in_tune and _received is None:  # after a signal, the watcher above decides
            _record_and_exit(f"error: {why}: recording the sweep without it; rerun the same command once a "
                             "cluster answers (finished trials are kept, the running ones resume from their "
                             "checkpoints)", record, 1)
        time.sleep(CLUSTER_POLL_S)
