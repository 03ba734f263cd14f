"""Shared fixtures: the real Hydra config, composed and shrunk; one prepared corpus per run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"

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
    from trainer.data import prepare
    from trainer.data_config import BilingualData

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
    from trainer.config import trial_config_from_dict

    return lambda *overrides: trial_config_from_dict(compose(*overrides))


def run_cli(args: list[str], cwd: Path, timeout: float = 600, env: dict | None = None):
    """Run `python sweep.py ARGS` as a user would, from cwd, and return the CompletedProcess."""
    import subprocess

    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
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
