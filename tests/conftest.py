"""Shared fixtures and helpers: the real Hydra config, composed and shrunk; one prepared corpus
per run; the tiny sweeps, models and synthetic result tables more than one test module uses."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "src" / "smallinit" / "conf"

# The unit tier (`make test-unit`, ~2 min) runs without a prepared corpus, a Ray cluster or a
# training run: a test that asks for one of these fixtures, or is marked integration or slow,
# is left out (a test that starts Ray or a sweep without them carries the mark itself).
INTEGRATION_FIXTURES = {"data_cache", "compose", "trial_config", "tiny_sweep", "empty_study_db", "study_folder",
                        "bilingual"}


def pytest_collection_modifyitems(items):
    for item in items:
        if INTEGRATION_FIXTURES & set(item.fixturenames) and not item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.integration)


# `make test-times` sets these: each tier's count, wall time and provenance go into one record
# (docs/records/test_times.json), so the README's test figures are quoted from what made them.
TEST_RECORD, TEST_TIER = os.environ.get("SMALLINIT_TEST_RECORD"), os.environ.get("SMALLINIT_TEST_TIER")
_STARTED = time.time()


def pytest_sessionfinish(session, exitstatus):
    if not (TEST_RECORD and TEST_TIER):
        return
    import json

    from smallinit.core.provenance import record

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:  # no terminal (a pytest-xdist worker): the controlling session writes the record
        return
    stats = reporter.stats
    counts = {k: len(stats.get(k, [])) for k in ("passed", "failed", "skipped", "error", "xfailed", "xpassed")}
    counts["passed"] = sum(1 for r in stats.get("passed", []) if r.when == "call")
    path = Path(TEST_RECORD)
    doc = json.loads(path.read_text()) if path.is_file() else {"about": "make test-times: each test tier's count and "
                                                                "wall time, with what ran it (one entry per tier)",
                                                                "tiers": {}}
    doc["tiers"][TEST_TIER] = {"markers": session.config.getoption("markexpr"), "collected": session.testscollected,
                               **counts, "exit_status": int(exitstatus), "wall_s": round(time.time() - _STARTED, 1),
                               "provenance": record()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


# Tiny but real: the bundled bilingual corpus, the nano model, a few optimizer steps.
TINY = [
    "model=nano",
    "train.batch_size=4",
    "train.seq_len=32",
    "train.max_tokens=1024",
    "train.eval_every=4",
    "train.eval_tokens=512",
    "train.per_token_eval_tokens=256",
    "train.probe_every=4",
    "train.ckpt_every=4",
    "train.threads=1",
    "wandb.mode=disabled",
]


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    """A session-wide corpus cache (SMALLINIT_CACHE), prepared once on first use.

    Set SMALLINIT_TEST_CACHE to reuse a cache between local test runs."""
    path = Path(os.environ.get("SMALLINIT_TEST_CACHE") or tmp_path_factory.mktemp("smallinit-cache"))
    os.environ["SMALLINIT_CACHE"] = str(path)
    from smallinit.data.config import BilingualData
    from smallinit.data.pipeline import prepare

    prepare(BilingualData(cache_dir=str(path)), log=lambda *_: None)
    return path


@pytest.fixture
def compose(data_cache):
    """compose(*overrides) -> the resolved config dict, as sweep.py would see it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    def _compose(*overrides: str, tiny: bool = True) -> dict:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = hydra_compose("config", overrides=[*(TINY if tiny else []), *overrides])
        return OmegaConf.to_container(cfg, resolve=True)

    return _compose


@pytest.fixture
def trial_config(compose):
    """trial_config(*overrides) -> a validated TrialConfig of the tiny setting."""
    from smallinit.trainer.config import trial_config_from_dict

    return lambda *overrides: trial_config_from_dict(compose(*overrides))


class StopAt:
    """A reporter that interrupts the run, as Ctrl-C would, once step k has been logged."""

    def __init__(self, k):
        self.k = k

    def log(self, step, metrics):
        if step >= self.k:
            raise KeyboardInterrupt

    def close(self):
        pass


def run_cli(args: list[str], cwd: Path, timeout: float = 600, env: dict | None = None):
    """Run `python sweep.py ARGS` as a user would, from cwd, and return the CompletedProcess."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), **(env or {})}
    return subprocess.run([sys.executable, str(REPO / "sweep.py"), *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


# The report's tiny sweep (8 trials: gamma x eps x train seed), run once per session through
# the real CLI; tests/test_report.py reports it, tests/test_sweep_outputs.py reads what it left.
SWEEP_ARGS = [
    "-m", "model=nano", "init.gamma=0.5,1.0", "norm.eps=1e-5,1e-12", "train.seed=0,1", "train.batch_size=4",
    "train.seq_len=32", "train.max_tokens=1024", "train.eval_every=4", "train.eval_tokens=512",
    "train.per_token_eval_tokens=256", "train.probe_every=4", "train.threads=1", "wandb.mode=disabled",
    "ray.num_cpus=2", "name=rep",
]


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory, data_cache) -> Path:
    tmp = tmp_path_factory.mktemp("report-sweep")
    proc = run_cli(SWEEP_ARGS, cwd=tmp, env={"SMALLINIT_CACHE": str(data_cache)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "sweeps" / "rep"


@pytest.fixture(scope="session")
def empty_study_db(tmp_path_factory) -> Path:
    """An empty Optuna database, created once: its schema takes seconds to write on 2 cores."""
    from smallinit.sweeper.study.study import default_storage_url, open_storage

    folder = tmp_path_factory.mktemp("empty-study")
    open_storage(default_storage_url(folder)).engine.dispose()
    return folder / "optuna.db"


@pytest.fixture
def study_folder(tmp_path, empty_study_db) -> Path:
    """A sweep folder (tmp_path) holding its own copy of the empty study database."""
    import shutil

    shutil.copy(empty_study_db, tmp_path / "optuna.db")
    return tmp_path


# ---- tiny sweeps through the real CLI (local Ray, SQLite study), and what they leave

CARD = ["init.gamma=0.5,0.75,1.0,1.25", "norm.eps=1e-5,1e-12"]
TINY_SWEEP = [t for t in TINY if not t.startswith("wandb.")] + ["ray.num_cpus=2"]
# Longer trials so the driver can be killed while some are finished and others running.
KILLABLE = [*CARD, "train.max_tokens=8192", "train.eval_every=16", "train.probe_every=0", "train.ckpt_every=8",
            "wandb.mode=disabled", "name=killed"]
# A learning rate that makes every trial diverge.
DIVERGES = ["optim.lr=1e12", "optim.grad_clip=null", "optim.warmup_frac=0", "train.max_tokens=4096"]


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def sweep(tmp_path, data_cache, *args, env=None, timeout=600):
    """`sweep.py -m` on the tiny defaults, where a key the test gives replaces the default's
    (as the Makefile's ARGS do): the sweep refuses a swept key given twice."""
    given = {_key(a) for a in args}
    defaults = [d for d in TINY_SWEEP if _key(d) not in given]
    return run_cli(["-m", *defaults, *args], cwd=tmp_path, timeout=timeout,
                   env={"SMALLINIT_CACHE": str(data_cache), "WANDB_API_KEY": "", **(env or {})})


def study_trials(sweep_dir: Path, name: str):
    import optuna

    study = optuna.load_study(study_name=name, storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    return study.get_trials(deepcopy=False)


def result_mtimes(sweep_dir: Path) -> dict[str, float]:
    return {p.parent.name: p.stat().st_mtime for p in sweep_dir.glob("trials/*/result.json")}


def table(tmp_path, name: str):
    """The results table of the sweep `name` run in tmp_path, as a DataFrame."""
    import pandas as pd

    return pd.read_parquet(tmp_path / "sweeps" / name / "results.parquet")


def kill_driver_mid_sweep(tmp_path, data_cache, args) -> dict[str, float]:
    """Start `sweep.py -m ARGS`, kill -9 its whole process group once two trials finished;
    return those trials' result.json mtimes."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), "SMALLINIT_CACHE": str(data_cache)}
    driver = subprocess.Popen([sys.executable, str(REPO / "sweep.py"), "-m", *TINY_SWEEP, *args], cwd=tmp_path,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    sweep_dir = tmp_path / "sweeps" / "killed"
    deadline = time.time() + 300
    while len(result_mtimes(sweep_dir)) < 2 and time.time() < deadline and driver.poll() is None:
        time.sleep(0.5)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    finished = result_mtimes(sweep_dir)
    assert 2 <= len(finished) < 8, "the driver should die mid-sweep"
    return finished


def sweeps_at_once(tmp_path, data_cache, storage: str, grids: dict[str, str]) -> dict:
    """Run one sweep per (name, gammas) at the same time on one study storage."""
    results = {}

    def run(name, gammas):
        results[name] = sweep(tmp_path, data_cache, f"init.gamma={gammas}", f"hydra.sweeper.storage={storage}",
                              "wandb.mode=disabled", f"name={name}")

    threads = [threading.Thread(target=run, args=item) for item in grids.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def error_line(proc) -> str:
    """The refusal: exactly one line on stderr, `error: ...`."""
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "WARNING" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


# ---- the report's CLI

WIDTHS = "64,128,256"


def report_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "smallinit.experiments.report.report", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)])})


# ---- experiments: composed with their Hydra sweeper config, expanded into trials

def compose_with_hydra(overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("config", overrides=overrides, return_hydra_config=True)


def trial_of(experiment, *overrides):
    from omegaconf import OmegaConf

    from smallinit.trainer.config import trial_config_from_dict

    container = OmegaConf.to_container(compose_with_hydra([f"+experiment={experiment}", *overrides]), resolve=False)
    container.pop("hydra")
    return trial_config_from_dict(OmegaConf.to_container(OmegaConf.create(container), resolve=True))


def grid_trials(experiment):
    from omegaconf import OmegaConf

    from smallinit.sweeper.config.space import parse_sweep

    base = compose_with_hydra([f"+experiment={experiment}"])
    params = OmegaConf.to_container(base.hydra.sweeper.params)
    space = parse_sweep([], params)
    return base, [trial_of(experiment, *space.overrides_for(point)) for point in space.grid()]


# ---- a tiny model and random token ids

def tiny_cfg(gamma: float = 0.5, seed: int = 0, **kw):
    """gamma = 0.5 by default so attention scores and gates are far from trivial."""
    from smallinit.model import InitConfig, ModelConfig

    base = dict(
        d_model=64,
        n_layers=2,
        n_heads=4,
        d_ff=96,
        vocab_size=97,
        max_seq_len=16,
        init=InitConfig(gamma=gamma, seed=seed),
    )
    base.update(kw)
    return ModelConfig(**base)


def tokens(vocab: int, B: int, T: int, seed: int = 0):
    import torch

    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# ---- synthetic result tables with known answers

def result_row(**kw) -> dict:
    base = dict(state="COMPLETE", model="micro", n_params=5_000_000, d_model=256, n_layers=4, eps=1e-12,
                norm="rmsnorm", gate="none", ffn="dense", task="lm", tokens=100_000, unigram_entropy=7.0,
                weight_decay=0.1)
    return {**base, **kw}


def write_results(root: Path, name: str, rows: list[dict]) -> Path:
    import pandas as pd

    d = root / name
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(d / "results.parquet")
    return d


def synthetic_sweep(root: Path, gain: float, sizes=(1e6, 3e6, 1e7, 3e7), seeds=3, noise=2e-3) -> Path:
    """A results table whose gamma=0.5 losses follow L = 2 + 30 N^-0.25 and whose gamma=1
    losses are those of a (1 + gain)x larger baseline, with paired seed noise."""
    import numpy as np

    rng = np.random.default_rng(1)
    law = lambda n: 2.0 + 30.0 * n**-0.25  # noqa: E731
    rows = []
    for i, n in enumerate(sizes):
        for s in range(seeds):
            shared = rng.normal(0, noise)  # a seed's luck is shared by both arms (paired)
            for gamma, loss in ((0.5, law(n)), (1.0, law((1 + gain) * n))):
                rows.append(dict(identity=f"{i}{s}{gamma}", state="COMPLETE", model=f"m{i}", n_params=int(n),
                                 d_model=64 * (i + 1), n_layers=2, gamma=gamma, init_seed=s, train_seed=0, eps=1e-12,
                                 norm="rmsnorm", gate="none", ffn="dense", task="lm", lr=3e-3, tokens=10_000,
                                 final_val_loss=loss + shared + rng.normal(0, noise / 4), unigram_entropy=7.0))
    return write_results(root, "synth", rows)


def width_sweep(root: Path, slope: float, intercept: float, seeds: int = 3, noise: float = 0.004,
                widths=(64, 128, 192, 256)) -> Path:
    """Recipe − baseline = intercept + slope·ln d (+ paired noise), each arm at two lrs where
    only one is its best."""
    import numpy as np

    rng = np.random.default_rng(5)
    rows = []
    for d in widths:
        for s in range(seeds):
            base = 6.0 - 0.3 * math.log(d) + rng.normal(0, 0.02)
            gap = intercept + slope * math.log(d) + rng.normal(0, noise)
            for arm, gamma, eps, gate, loss in (("b", 0.5, 1e-5, "none", base), ("r", 1.0, 1e-12, "elementwise", base + gap)):
                for lr, penalty in ((3e-3, 0.0), (1e-3, 0.2)):
                    rows.append(result_row(identity=f"{d}-{s}-{arm}-{lr}", model="micro", d_model=d,
                                           n_params=2000 * d * d // 64, gamma=gamma, eps=eps, gate=gate, lr=lr,
                                           init_seed=s, train_seed=s, final_val_loss=loss + penalty))
    return write_results(root, "widths", rows)
