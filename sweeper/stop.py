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
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading

_received: int | None = None
_in_tune = False

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
    """Route SIGINT and SIGTERM here. Call from the main thread at start, and again after
    ray.init (which replaces the SIGTERM handler)."""
    if threading.current_thread() is not threading.main_thread():
        return
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    for name, starts in _TUNE_STOP_LINES.items():
        tune_log = logging.getLogger(name)
        if not any(isinstance(f, _HideTuneStopLines) for f in tune_log.filters):
            tune_log.addFilter(_HideTuneStopLines(starts))
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


def received() -> int | None:
    """The first stop signal this process received, if any."""
    return _received


def signal_name() -> str:
    return signal.Signals(_received).name if _received is not None else "an interrupt"


def exit_status(status: int) -> int:
    """The status to exit with: 128 + the signal after a stop signal, else `status`."""
    return 128 + _received if _received is not None else status


@contextlib.contextmanager
def tune_takes_stops():
    """While Tune's loop runs, a stop signal asks Tune to stop cleanly instead of unwinding."""
    global _in_tune
    _in_tune = True
    try:
        yield
    finally:
        _in_tune = False


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
        return
    raise KeyboardInterrupt
