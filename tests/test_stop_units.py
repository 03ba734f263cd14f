"""How the driver stops (sweeper/runtime/stop.py) without starting Ray: the resume line, the exit status
128 + signal, a signal handed to Tune's stop, and the decision that Ray's own processes are gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from smallinit.sweeper.runtime import cluster, ray_internals, stop

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_signal_yet(monkeypatch):
    """The module's process-wide state as at start; restored after each test."""
    monkeypatch.setattr(stop, "_received", None)
    monkeypatch.setattr(stop, "_in_tune", False)
    monkeypatch.setattr(stop, "_without_ray", None)


def test_before_any_signal_the_status_is_the_runs_own():
    assert stop.received() is None
    assert [stop.exit_status(s) for s in (0, 1)] == [0, 1]
    assert stop.resume_line() == "stopped by an interrupt; rerun the same command to resume"


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_after_a_signal_the_status_is_128_plus_it_and_the_line_names_it(monkeypatch, signum, status):
    monkeypatch.setattr(stop, "_received", signum)
    assert [stop.exit_status(s) for s in (0, 1)] == [status, status]
    assert stop.resume_line() == f"stopped by {signum.name}; rerun the same command to resume"


def test_outside_tune_a_signal_unwinds_and_the_first_one_is_kept():
    with pytest.raises(KeyboardInterrupt):
        stop._on_signal(signal.SIGTERM, None)
    with pytest.raises(KeyboardInterrupt):
        stop._on_signal(signal.SIGINT, None)
    assert stop.received() == signal.SIGTERM


def test_inside_tune_the_first_signal_asks_tunes_stop_and_the_second_unwinds(capsys):
    asked = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: asked.append(signum))
    try:
        with stop.tune_takes_stops():
            stop._on_signal(signal.SIGINT, None)  # no raise: Tune ends its trials
            assert asked == [signal.SIGUSR1]
            with pytest.raises(KeyboardInterrupt):
                stop._on_signal(signal.SIGINT, None)
            assert asked == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert capsys.readouterr().err.startswith("\nstopping on SIGINT: ending the running trials; rerun the same command")


def test_tune_takes_stops_watches_for_ray_only_with_both_callbacks_and_resets_on_error():
    def record():
        return None

    def lost():
        return False

    with stop.tune_takes_stops(record, lost):
        assert (stop._in_tune, stop._without_ray) == (True, (record, lost))
    with pytest.raises(ValueError), stop.tune_takes_stops(record):
        assert (stop._in_tune, stop._without_ray) == (True, None)
        raise ValueError
    assert (stop._in_tune, stop._without_ray) == (False, None)


def test_once_ray_is_lost_the_sweep_is_recorded_and_the_driver_exits_with_the_signals_status(monkeypatch):
    class Exited(Exception):
        pass

    def _exit(status):
        raise Exited(status)

    monkeypatch.setattr(stop, "os", SimpleNamespace(_exit=_exit))
    monkeypatch.setattr(stop, "POLL_S", 0.0)
    monkeypatch.setattr(stop, "_received", signal.SIGTERM)
    monkeypatch.setattr(stop, "_in_tune", True)
    polls, recorded = iter([False, False, True]), []
    with pytest.raises(Exited) as e:
        stop._finish_if_ray_is_lost(lambda: recorded.append("results"), lambda: next(polls))
    assert (e.value.args, recorded) == ((143,), ["results"])


def test_the_watch_ends_without_recording_once_tunes_loop_has_ended(monkeypatch):
    monkeypatch.setattr(stop, "POLL_S", 0.0)
    monkeypatch.setattr(stop, "_in_tune", True)
    recorded, polls = [], []

    def lost():
        polls.append(1)
        if len(polls) == 3:
            stop._in_tune = False  # Tune stopped cleanly with Ray alive
        return False

    stop._finish_if_ray_is_lost(lambda: recorded.append("results"), lost)
    assert (len(polls), recorded) == (3, [])


@pytest.fixture
def head(monkeypatch):
    """A stand-in Ray head: real processes, one still running, listed as Ray lists its own."""
    alive = subprocess.Popen(["sleep", "30"])
    ended = subprocess.Popen(["true"])
    ended.wait()
    listed = {}
    monkeypatch.setattr(ray_internals, "local_head_processes", lambda: listed)
    yield SimpleNamespace(alive=alive, ended=ended, listed=listed)
    alive.kill()
    alive.wait()


def test_ray_is_lost_once_any_of_its_head_processes_has_ended(head):
    head.listed.update(raylet=[head.alive], gcs_server=[head.alive])
    assert cluster.local_ray_lost() is False
    head.listed.update(log_monitor=[head.ended])
    assert cluster.local_ray_lost() is True
    head.listed.clear()  # only joined a cluster: nothing of ours to lose
    assert cluster.local_ray_lost() is False


def test_ray_is_not_judged_lost_when_its_internals_moved(monkeypatch):
    def moved():
        raise ray_internals.RayInternalsMoved("ray._private.worker._global_node is gone")

    monkeypatch.setattr(ray_internals, "local_head_processes", moved)
    assert cluster.local_ray_lost() is False


def test_a_driver_stopped_by_sigterm_prints_the_resume_line_and_exits_143(tmp_path):
    code = textwrap.dedent("""
        import sys, time
        from smallinit.sweeper.runtime import stop
        stop.install()
        try:  # "ready" inside the try: the signal may land while print is still returning
            print("ready", flush=True)
            time.sleep(30)
        except KeyboardInterrupt:
            print(stop.resume_line(), flush=True)
            sys.exit(stop.exit_status(1))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)])})
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (143, "stopped by SIGTERM; rerun the same command to resume\n")


def test_while_ray_starts_our_handlers_stay_and_other_signals_pass():
    """ray.init sets SIGTERM to sys.exit(15): inside handlers_kept() that request is a no-op."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)}
    real = signal.signal
    try:
        stop.install()
        with stop.handlers_kept():
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(15))
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGTERM) is stop._on_signal
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN and signal.signal is real
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_a_signal_whose_interrupt_was_dropped_still_stops_the_driver_at_its_next_step():
    with pytest.raises(KeyboardInterrupt):
        stop._on_signal(signal.SIGTERM, None)  # outside Tune: unwinds (a destructor would drop this)
    with pytest.raises(KeyboardInterrupt):
        stop.check()
    with pytest.raises(KeyboardInterrupt), stop.tune_takes_stops():
        pass


@pytest.mark.parametrize("place", ["destructor", "at_fork_hook"])
def test_a_signal_landing_where_python_drops_exceptions_still_unwinds_the_main_thread_with_no_output(place):
    """CI once saw SIGTERM land in logging's at-fork hook while Ray started a process: the stop's
    KeyboardInterrupt was printed as "Exception ignored" and dropped. It must unwind the next step."""
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        from smallinit.sweeper.runtime import stop
        stop.install()

        def signal_here():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # bytecode inside the hook: the handler runs here
                pass

        class Dropped:
            def __del__(self):
                signal_here()

        try:
            if "{place}" == "destructor":
                Dropped()
            else:
                os.register_at_fork(after_in_parent=signal_here)
                if os.fork() == 0:
                    os._exit(0)
            time.sleep(5)
            print("not stopped", flush=True)
        except KeyboardInterrupt:
            print(stop.resume_line(), flush=True)
            sys.exit(stop.exit_status(1))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)])})
    assert (proc.returncode, proc.stdout, proc.stderr) == (143, "stopped by SIGTERM; rerun the same command to resume\n", "")
