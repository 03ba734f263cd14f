"""The sweep folder's driver lock (sweeper/runtime/lock.py): real files, and real second processes
that hold the lock, die holding it, or are long gone."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from smallinit.core.errors import ConfigError
from smallinit.sweeper.runtime import lock as lock_module
from smallinit.sweeper.runtime.lock import LOCK_FILE, DriverLock

REPO = Path(__file__).resolve().parents[1]


def _holder(sweep_dir: Path, text: str | None = None, write_after: float = 0.0) -> subprocess.Popen:
    """A second process holding the folder's lock until killed: a real driver's DriverLock, or,
    with `text`, a bare record lock on a file holding that text, written `write_after` seconds
    after it says it holds the lock."""
    if text is None:
        body = f"from smallinit.sweeper.runtime.lock import DriverLock\nDriverLock({str(sweep_dir)!r}).acquire()"
    else:
        body = f"""
            import fcntl, os, threading, time
            fd = os.open({str(sweep_dir / LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            threading.Thread(target=lambda: (time.sleep({write_after}), os.write(fd, {text.encode()!r}))).start()"""
    code = textwrap.dedent(body) + "\nprint('held', flush=True)\nimport time\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)])})
    assert proc.stdout.readline() == "held\n"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _write_lock(sweep_dir: Path, holder: dict | str) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / LOCK_FILE).write_text(holder if isinstance(holder, str) else json.dumps(holder))


@pytest.fixture
def no_record_locks(monkeypatch):
    """A filesystem without POSIX record locks (some NFS mounts): lockf fails with ENOLCK."""
    def lockf(fd, cmd, *args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock_module.fcntl, "lockf", lockf)


def test_the_lock_names_its_driver_and_release_removes_it(tmp_path):
    sweep_dir = tmp_path / "sweep"
    with DriverLock(sweep_dir) as held:
        text = json.loads((sweep_dir / LOCK_FILE).read_text())
        assert (text["pid"], text["host"]) == (os.getpid(), socket.gethostname())
        assert held.took_over is None
    assert not (sweep_dir / LOCK_FILE).exists()


def test_a_refused_or_finished_sweep_leaves_no_folder_it_created(tmp_path):
    with DriverLock(tmp_path / "a" / "b" / "sweep"):
        assert (tmp_path / "a" / "b" / "sweep" / LOCK_FILE).is_file()
    assert list(tmp_path.iterdir()) == []
    kept = tmp_path / "kept"
    with DriverLock(kept):
        (kept / "optuna.db").write_text("")  # the sweep wrote here: the folder stays
    assert [p.name for p in kept.iterdir()] == ["optuna.db"]


def test_a_second_driver_is_refused_in_one_line_naming_the_holder(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = _holder(sweep_dir)
    try:
        with pytest.raises(ConfigError) as e:
            DriverLock(sweep_dir).acquire()
        message = str(e.value)
        assert message.startswith(f"{sweep_dir} is in use by another sweep driver (pid {proc.pid} on host "
                                  f"{socket.gethostname()}, since ")
        assert message.endswith("); wait for it to end or stop it, or use another name=...")
        assert "\n" not in message
        # The refused driver leaves the holder's lock as it was.
        assert json.loads((sweep_dir / LOCK_FILE).read_text())["pid"] == proc.pid
    finally:
        _stop(proc)


def test_a_lock_held_by_a_process_whose_text_is_damaged_is_still_refused(tmp_path):
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    proc = _holder(sweep_dir, text="{not json")
    try:
        with pytest.raises(ConfigError, match=r"is in use by another sweep driver \(its lock file gives no pid\)"):
            DriverLock(sweep_dir).acquire()
    finally:
        _stop(proc)


def test_a_driver_that_loses_the_race_by_moments_still_names_the_winner(tmp_path):
    """The winner writes its text just after taking the lock; a loser that reads the file in
    between waits for the text rather than saying the lock gives no pid."""
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    proc = _holder(sweep_dir, text=json.dumps({"pid": 4242, "host": "winner", "since": "now"}), write_after=0.3)
    try:
        with pytest.raises(ConfigError, match=r"\(pid 4242 on host winner, since now\)"):
            DriverLock(sweep_dir).acquire()
    finally:
        _stop(proc)


def test_the_lock_of_a_killed_driver_is_taken_over_and_says_whose_it_was(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    proc = _holder(sweep_dir)
    proc.send_signal(signal.SIGKILL)  # no exit hook runs: the file stays, the kernel drops the lock
    proc.wait()
    left = json.loads((sweep_dir / LOCK_FILE).read_text())
    assert left["pid"] == proc.pid
    with DriverLock(sweep_dir) as held:
        assert held.took_over == left
        assert json.loads((sweep_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert capsys.readouterr().out == (f"taking over {sweep_dir / LOCK_FILE}: its driver (pid {proc.pid} on "
                                       f"{socket.gethostname()}, since {left['since']}) is gone\n")


def test_an_unheld_lock_from_another_host_is_taken_over_where_the_filesystem_locks(tmp_path, capsys):
    """Record locks work across hosts (NFS): no holder means its driver is gone, wherever it ran."""
    sweep_dir = tmp_path / "sweep"
    _write_lock(sweep_dir, {"pid": 1, "host": "node-17", "since": "2026-01-02 03:04:05 UTC"})
    with DriverLock(sweep_dir):
        pass
    assert "its driver (pid 1 on node-17, since 2026-01-02 03:04:05 UTC) is gone" in capsys.readouterr().out


def test_an_unheld_damaged_lock_file_is_taken_over_without_a_word(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    _write_lock(sweep_dir, "\x00\x00garbage")
    with DriverLock(sweep_dir) as held:
        assert held.took_over is None
        assert json.loads((sweep_dir / LOCK_FILE).read_text())["pid"] == os.getpid()  # no old bytes left
    assert capsys.readouterr().out == ""


def test_without_record_locks_a_dead_pid_on_this_host_is_taken_over(tmp_path, capsys, no_record_locks):
    sweep_dir = tmp_path / "sweep"
    pid = _dead_pid()
    _write_lock(sweep_dir, {"pid": pid, "host": socket.gethostname(), "since": "then"})
    with DriverLock(sweep_dir):
        pass
    assert f"its driver (pid {pid} on {socket.gethostname()}, since then) is gone" in capsys.readouterr().out


@pytest.mark.parametrize("holder", [
    {"pid": os.getppid(), "host": socket.gethostname(), "since": "then"},  # alive here
    {"pid": 1, "host": "node-17", "since": "then"},  # another host: its pid cannot be checked
])
def test_without_record_locks_a_live_or_uncheckable_holder_is_refused(tmp_path, no_record_locks, holder):
    sweep_dir = tmp_path / "sweep"
    _write_lock(sweep_dir, holder)
    with pytest.raises(ConfigError, match=rf"in use by another sweep driver \(pid {holder['pid']} on host "
                                          rf"{holder['host']}, since then\)"):
        DriverLock(sweep_dir).acquire()
    assert json.loads((sweep_dir / LOCK_FILE).read_text()) == holder


def test_an_unwritable_sweep_folder_is_refused_in_one_line_and_nothing_is_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError) as e:
        DriverLock(blocker / "sweep").acquire()
    assert str(e.value).startswith(f"hydra.sweep.dir={str(blocker / 'sweep')!r} is invalid: cannot write there (")
    assert str(e.value).endswith("choose a writable folder with name=... or hydra.sweep.dir=...")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_folder_with_files_but_no_mark_of_a_sweep_is_refused_and_left_as_it_was(tmp_path):
    """`hydra.sweep.dir=/` or a source tree: refused before the lock file; an empty folder and a
    sweep's own folder (any of its marks) are taken."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    for name in ("a.txt", "b", "c", "d", "e", "f"):
        (theirs / name).write_text("mine")
    with pytest.raises(ConfigError) as e:
        DriverLock(theirs).acquire()
    assert str(e.value) == (f"hydra.sweep.dir={str(theirs)!r} is invalid: it holds files no sweep wrote (a.txt, b, c, d, "
                            "e and 1 more); a sweep writes into a new or empty folder or its own: choose one with "
                            "name=... or hydra.sweep.dir=... (nothing was written)")
    assert sorted(p.name for p in theirs.iterdir()) == ["a.txt", "b", "c", "d", "e", "f"]
    (tmp_path / "empty").mkdir()
    for hidden in (".gitkeep", ".nfs0000001", "lost+found"):  # not a user's files: the folder counts as empty
        (tmp_path / "empty" / hidden).mkdir() if hidden == "lost+found" else (tmp_path / "empty" / hidden).write_text("")
    for folder, mark in ((tmp_path / "empty", None), (theirs, "trials"), (theirs, "fixed_overrides.json")):
        if mark:
            (theirs / mark).mkdir() if mark == "trials" else (theirs / mark).write_text("{}")
        held = DriverLock(folder)
        held.acquire()
        held.release()
