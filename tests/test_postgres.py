"""The team path for real: sweeps against a PostgreSQL study on a server the tests start
themselves (tests/postgres_server.py). Skipped, with the reason shown, only where the server
binaries or the driver are absent; `.ci/run` installs both."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import optuna
import pandas as pd
import pytest

from smallinit.core.errors import ConfigError
from smallinit.sweeper.study import study as study_mod

from .conftest import (
    CARD,
    KILLABLE,
    REPO,
    kill_driver_mid_sweep,
    result_mtimes,
    sweep,
    sweeps_at_once,
)
from .postgres_server import PostgresServer, missing_reason


@pytest.fixture(scope="module")
def pg():
    why = missing_reason()
    if why:
        pytest.skip(why)
    with PostgresServer() as server:
        yield server


def trials_at(url: str, name: str):
    return optuna.load_study(study_name=name, storage=study_mod.storage_url(url)).get_trials(deepcopy=False)


def test_a_plain_postgresql_url_opens_with_the_installed_driver(monkeypatch):
    installed = {"psycopg"}
    monkeypatch.setattr(study_mod.importlib.util, "find_spec", lambda name: object() if name in installed else None)
    assert study_mod.storage_url("postgresql://me@db/optuna") == "postgresql+psycopg://me@db/optuna"
    assert study_mod.storage_url("postgresql+psycopg2://me@db/optuna") == "postgresql+psycopg2://me@db/optuna"
    assert study_mod.storage_url("sqlite:///x.db") == "sqlite:///x.db"
    installed = {"psycopg2"}
    assert study_mod.storage_url("postgresql://me@db/optuna") == "postgresql://me@db/optuna"
    installed = set()
    with pytest.raises(ConfigError) as e:
        study_mod.storage_url("postgresql://me:s3cret@db/optuna")
    assert "[postgres]" in str(e.value) and "hydra.sweeper.storage" in str(e.value) and "s3cret" not in str(e.value)


def test_a_password_never_reaches_a_message():
    assert study_mod.redacted("postgresql://me:s3cret@db:5432/optuna") == "postgresql://me:***@db:5432/optuna"
    assert study_mod.redacted("postgresql://me@db/optuna") == "postgresql://me@db/optuna"
    assert study_mod.redacted("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"


@pytest.mark.slow  # make test stays under 10 min on 2 cores; CI runs it after
def test_card_grid_on_a_postgres_study_records_each_trial_once_and_the_dashboard_reads_it(tmp_path, data_cache, pg):
    url = pg.create("card")
    proc = sweep(tmp_path, data_cache, *CARD, f"hydra.sweeper.storage={url}", "wandb.mode=disabled", "name=card")
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_parquet(tmp_path / "sweeps" / "card" / "results.parquet")
    assert len(df) == 8 and set(df["state"]) == {"COMPLETE"} and df["identity"].is_unique
    trials = trials_at(url, "card")
    assert len(trials) == 8 and {t.state for t in trials} == {optuna.trial.TrialState.COMPLETE}
    assert {t.user_attrs["identity"] for t in trials} == set(df["identity"])
    assert sorted((t.params["init.gamma"], t.params["norm.eps"]) for t in trials) == sorted(
        (g, e) for g in (0.5, 0.75, 1.0, 1.25) for e in (1e-5, 1e-12))
    assert all(len(t.intermediate_values) == 3 and t.value > 0 for t in trials)
    assert not (tmp_path / "sweeps" / "card" / "optuna.db").exists()  # the study lives in the server

    again = sweep(tmp_path, data_cache, *CARD, f"hydra.sweeper.storage={url}", "wandb.mode=disabled", "name=card")
    assert again.returncode == 0 and "8 trials (8 already done)" in again.stdout, again.stderr[-3000:]

    # The dashboard docs/sweeps.md shows, on the same URL: its API lists the study and its trials.
    port = pg.port + 1
    while _in_use(port):
        port += 1
    server = subprocess.Popen([sys.executable, "-m", "smallinit.sweeper.study.dashboard", "--storage", url, "--port", str(port)],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        studies = _get_json(f"http://127.0.0.1:{port}/api/studies", server)
        (card,) = [s for s in studies["study_summaries"] if s["study_name"] == "card"]
        detail = _get_json(f"http://127.0.0.1:{port}/api/studies/{card['study_id']}", server)
        assert len(detail["trials"]) == 8
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


@pytest.mark.slow
def test_two_sweeps_on_one_database_at_once_stay_complete_and_separate(tmp_path, data_cache, pg):
    url = pg.create("team")
    results = sweeps_at_once(tmp_path, data_cache, url, {"left": "0.5,0.75,1.0", "right": "1.0,1.25,1.5"})
    for name, gammas in (("left", {0.5, 0.75, 1.0}), ("right", {1.0, 1.25, 1.5})):
        assert results[name].returncode == 0, results[name].stderr[-3000:]
        trials = trials_at(url, name)
        assert len(trials) == 3 and {t.state for t in trials} == {optuna.trial.TrialState.COMPLETE}
        assert {t.params["init.gamma"] for t in trials} == gammas


@pytest.mark.slow
def test_killed_driver_reruns_against_the_same_database_without_duplicates(tmp_path, data_cache, pg):
    url = pg.create("killed")
    args = [*KILLABLE, f"hydra.sweeper.storage={url}"]
    finished = kill_driver_mid_sweep(tmp_path, data_cache, args)
    proc = sweep(tmp_path, data_cache, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = trials_at(url, "killed")
    identities = [t.user_attrs["identity"] for t in trials]
    assert len(trials) == 8 and len(set(identities)) == 8
    assert {t.state for t in trials} == {optuna.trial.TrialState.COMPLETE}
    after = result_mtimes(tmp_path / "sweeps" / "killed")
    assert {k: after[k] for k in finished} == finished  # finished trials were not trained again


def _in_use(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _get_json(url: str, server: subprocess.Popen, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                out = server.stdout.read() if server.poll() is not None else ""
                raise AssertionError(f"optuna-dashboard did not answer at {url}: {out[-2000:]}") from None
            time.sleep(0.5)


def test_the_dashboard_finds_a_sweeps_sqlite_study_or_says_what_is_missing(tmp_path):
    from smallinit.sweeper.study.dashboard import resolve

    (tmp_path / "s").mkdir()
    with pytest.raises(ConfigError, match="optuna.db does not exist"):
        resolve(str(tmp_path / "s"), None)
    (tmp_path / "s" / "optuna.db").touch()
    assert resolve(str(tmp_path / "s"), None) == f"sqlite:///{(tmp_path / 's' / 'optuna.db').resolve()}"


@pytest.mark.slow  # ~60 s: a long trial in one driver while a second driver on the same study starts
def test_a_second_sweep_on_the_study_leaves_a_trial_another_live_driver_trains(tmp_path, data_cache, pg):
    """Two sweep folders on one study: the second finds the first's trial RUNNING and its driver
    alive, so it does not adopt it (both drivers would finish one study trial:
    UpdateFinishedTrialError); the study ends with the trial once, COMPLETE."""
    from .conftest import TINY_SWEEP

    url = pg.create("shared")
    args = [*TINY_SWEEP, "init.gamma=0.5", "train.max_tokens=32768", "train.eval_every=16", "train.ckpt_every=8",
            "train.probe_every=0", "wandb.mode=disabled", f"hydra.sweeper.storage={url}",
            "hydra.sweeper.study_name=shared"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), "SMALLINIT_CACHE": str(data_cache), "WANDB_API_KEY": ""}
    first = subprocess.Popen([sys.executable, str(REPO / "sweep.py"), "-m", *args, "name=a"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and first.poll() is None and not list(tmp_path.glob("sweeps/a/trials/*/checkpoint.pt")):
        time.sleep(0.2)
    assert first.poll() is None, "the first sweep ended before its trial checkpointed"
    second = sweep(tmp_path, data_cache, *args[len(TINY_SWEEP):], "name=b")
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0 and "Traceback" not in out + err, err[-3000:]
    assert second.returncode == 0 and "Traceback" not in second.stdout + second.stderr, second.stderr[-3000:]
    assert (f"study: 1 trial of this sweep is being trained by another sweep's driver ({tmp_path / 'sweeps' / 'a'} "
            f"(pid {first.pid} on ") in second.stdout
    assert not list(tmp_path.glob("sweeps/b/trials/*/result.json"))  # not trained twice
    trials = trials_at(url, "shared")
    assert len(trials) == 1 and trials[0].state == optuna.trial.TrialState.COMPLETE
