"""One trial on several processes (trainer/distributed.py): 2 gloo ranks on the CPU, DDP and
FSDP2, reproduce the one-process loss trajectory of the same settings over 20 steps, and
through Ray Train a sweep trial trained by 2 workers ends as the 1-worker trial does. Over
hundreds of steps the two part (float summation order, amplified: docs/sweeps.md), so the
worker count above 1 is part of a trial's identity, and a checkpoint resumes only under the
worker count that wrote it."""

from __future__ import annotations

import gc
import json
import math
import os
import socket

import pandas as pd
import pytest
import torch
import torch.multiprocessing as mp

from smallinit.core.errors import ConfigError
from smallinit.core.trial_dir import TrialDir
from smallinit.trainer.distributed import check_split
from smallinit.trainer.loop import run_trial

from .conftest import TINY

# 20 optimizer steps, a training row at each, one evaluation mid-way and at the end.
STEPS = ["train.max_tokens=null", "train.max_steps=20", "train.log_every=1", "train.eval_every=10",
         "train.probe_every=10", "train.ckpt_every=0"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Interrupted(RuntimeError):
    pass


class _StopAt:
    """A reporter that ends the trial at a step, as a kill would (the checkpoint before it stays)."""

    def __init__(self, step: int | None):
        self.step = step

    def log(self, step: int, metrics: dict) -> None:
        if self.step is not None and step >= self.step:
            raise Interrupted(f"stopped at step {step}")

    def close(self) -> None:
        pass


def _rank(rank: int, world: int, port: int, kind: str, trial, out_dir: str, stop_at: int | None = None) -> None:
    """One rank of a 2-process trial (torch.multiprocessing's entry point)."""
    import torch.distributed as dist

    from smallinit.trainer.distributed import Parallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        run_trial(trial, out_dir, reporter=_StopAt(stop_at), log=lambda *_: None, dist=Parallel(kind, torch.device("cpu")))
        # The DDP wrapper's reducer holds the gloo group and sits in reference cycles: freed only at
        # interpreter exit, its worker threads can abort the process (SIGABRT, once in a CI run).
        # Free it here, and let both ranks finish their last collective, before tearing down.
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _train(trial, folder, workers: int, stop_at: int | None = None) -> None:
    if workers == 1:
        run_trial(trial, folder, reporter=_StopAt(stop_at), log=lambda *_: None)
    else:
        mp.spawn(_rank, args=(workers, _free_port(), trial.train.parallel, trial, str(folder), stop_at), nprocs=workers)


def _losses(folder) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in TrialDir(folder).metrics.read_text().splitlines()]
    return {r["step"]: {k: r[k] for k in ("train/loss", "val/loss") if r.get(k) is not None} for r in rows}


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])  # about 30 s each on 2 cores
def test_two_ranks_reproduce_the_one_process_loss_trajectory(trial_config, tmp_path, kind):
    trial = trial_config(*STEPS, "train.dtype=fp32", f"train.parallel={kind}")
    one = run_trial(trial, tmp_path / "one", log=lambda *_: None)
    _train(trial, tmp_path / "two", 2)
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert sorted(a) == sorted(b) and sum("train/loss" in row for row in a.values()) == 20
    for step, row in a.items():
        for key, value in row.items():
            assert b[step][key] == pytest.approx(value, rel=1e-5), (kind, step, key)
    two = TrialDir(tmp_path / "two").read_result()
    assert two["steps"] == 20 and one.identity == trial.identity() != two["identity"] == trial.identity(2)
    assert TrialDir(tmp_path / "two").read_trial()["workers"] == 2 and TrialDir(tmp_path / "one").read_trial()["workers"] == 1
    # model.pt holds the whole model, whatever the sharding. Its weights agree less tightly
    # than the losses: Adam divides by sqrt(v), so where a gradient is near zero a summation-
    # order difference moves a weight by up to lr per step (lr 3e-3 here).
    w1 = torch.load(TrialDir(tmp_path / "one").model_weights, weights_only=False)["model"]
    w2 = torch.load(TrialDir(tmp_path / "two").model_weights, weights_only=False)["model"]
    assert w1.keys() == w2.keys()
    worst = max(float((w1[k] - w2[k]).abs().max() / w1[k].abs().max().clamp_min(1e-12)) for k in w1)
    assert worst < 5e-3, worst


@pytest.mark.parametrize("kind", ["fsdp", pytest.param("ddp", marks=pytest.mark.slow)])
def test_two_ranks_train_each_budgets_cooldown_as_one_process_does(trial_config, tmp_path, kind):
    """train.budgets on several workers: each side trip (the stable state copied, a cooldown
    trained, evaluated on rank 0, the state put back) gives one process's budget results."""
    trial = trial_config("optim.schedule=wsd", "train.budgets=[1280,2560]", "train.log_every=1", "train.eval_every=10",
                         "train.probe_every=10", "train.ckpt_every=0", "train.dtype=fp32", f"train.parallel={kind}")
    run_trial(trial, tmp_path / "one", log=lambda *_: None)
    _train(trial, tmp_path / "two", 2)
    for budget in (1280, 2560):
        one = json.loads(TrialDir(tmp_path / "one").budget_json(budget).read_text()) \
            if budget < 2560 else TrialDir(tmp_path / "one").read_result()
        two = json.loads(TrialDir(tmp_path / "two").budget_json(budget).read_text()) \
            if budget < 2560 else TrialDir(tmp_path / "two").read_result()
        assert (two["budget_tokens"], two["steps"]) == (one["budget_tokens"], one["steps"]) == (budget, budget // 128)
        assert two["final_val_loss"] == pytest.approx(one["final_val_loss"], rel=1e-5), budget
        assert two["final_metrics"]["train/loss"] == pytest.approx(one["final_metrics"]["train/loss"], rel=1e-5), budget
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "two")  # the main run, put back after each side trip
    assert sorted(a) == sorted(b)
    for step, row in a.items():
        for key, value in row.items():
            assert b[step][key] == pytest.approx(value, rel=1e-5), (step, key)


def _count(workers: int) -> str:
    return "1 worker" if workers == 1 else f"{workers} workers"


@pytest.mark.parametrize(("kind", "before", "after"), [pytest.param("fsdp", 2, 1, marks=pytest.mark.slow), ("ddp", 1, 2),
                                                       pytest.param("ddp", 2, 2, marks=pytest.mark.slow)])
def test_a_checkpoint_resumes_under_the_worker_count_that_wrote_it(trial_config, tmp_path, kind, before, after):
    """A trial stopped at step 12 (checkpoint at 10) by `before` workers ends, resumed under the
    same count, on the losses of an uninterrupted run of that count. Under another count it is
    another trial: refused in one line before anything in the folder changes (two FSDP ranks'
    sharded checkpoint to one process, one process's checkpoint.pt to two DDP ranks)."""
    trial = trial_config(*STEPS, "train.ckpt_every=10", "train.dtype=fp32", f"train.parallel={kind}")
    _train(trial, tmp_path / "ref", before)
    with pytest.raises((Interrupted, mp.ProcessRaisedException), match="stopped at step 12"):
        _train(trial, tmp_path / "cut", before, stop_at=12)
    folder = TrialDir(tmp_path / "cut")
    assert [folder.checkpoint.exists(), folder.checkpoint_dcp.exists()] == [before == 1, before > 1]
    if after != before:
        line = (f"{folder.path} holds a checkpoint of trial {trial.identity(before)}, this trial on {_count(before)}, "
                f"not {trial.identity(after)} on {_count(after)}: a trial's worker count is part of its identity "
                f"(docs/sweeps.md); run it there on {_count(before)}, or use another folder")
        metrics = folder.metrics.read_bytes()
        with pytest.raises((RuntimeError, mp.ProcessRaisedException)) as e:
            _train(trial, tmp_path / "cut", after)
        if after == 1:  # this process's own error: the line, nothing more
            assert str(e.value) == line
        else:  # each rank raised it (rank 0 read the folder); mp.spawn shows one rank's traceback
            assert f"ForeignFolder: {line}\n" in str(e.value)
        assert folder.read_trial()["identity"] == trial.identity(before) and folder.read_trial()["workers"] == before
        assert folder.has_checkpoint and folder.metrics.read_bytes() == metrics
    _train(trial, tmp_path / "cut", before)
    ref, cut = _losses(tmp_path / "ref"), _losses(tmp_path / "cut")
    assert sorted(ref) == sorted(cut)  # the rows after the checkpoint were dropped, then written again
    for step, row in ref.items():
        for key, value in row.items():
            assert cut[step][key] == pytest.approx(value, rel=1e-5), (step, key)
    assert not folder.checkpoint.exists() and not folder.checkpoint_dcp.exists()
    assert folder.read_result()["identity"] == TrialDir(tmp_path / "ref").read_result()["identity"] == trial.identity(before)


def test_a_dead_worker_is_the_environments_fault():
    import ray.exceptions

    from smallinit.sweeper.worker import failures

    assert failures.classify(ray.exceptions.ActorDiedError())[0] == failures.TRANSIENT


def test_identity_does_not_depend_on_parallel(trial_config):
    assert trial_config("train.parallel=fsdp").identity() == trial_config().identity()
    assert trial_config("train.parallel=fsdp").identity(2) == trial_config().identity(2)


def test_identity_holds_the_worker_count_above_one(trial_config):
    """One worker is the identity every trial always had; each other count is its own trial,
    and the identity says which count it was."""
    trial = trial_config()
    ids = [trial.identity(n) for n in (1, 2, 4, 8)]
    assert ids[0] == trial.identity() and len(set(ids)) == 4
    assert [trial.workers_of(i) for i in ids] == [1, 2, 4, 8]
    assert trial.workers_of(trial_config("train.seed=1").identity(2)) is None  # another trial's


@pytest.mark.slow  # about 2 minutes on 2 loaded cores
def test_512_steps_on_one_and_on_two_workers_are_two_trials(trial_config, tmp_path):
    """Issue #41: over 512 steps two DDP ranks' losses part from one process's (at step 28 here,
    by 0.02 nats of val loss at the end: docs/sweeps.md), as a 1e-7 change to one process's
    gradients parts them; so each worker count is its own trial. Both finish, each under its own
    identity; the drift is printed (pytest -s), not asserted: its size is the docs' to state."""
    trial = trial_config("train.max_tokens=null", "train.max_steps=512", "train.log_every=1", "train.eval_every=64",
                         "train.probe_every=0", "train.ckpt_every=0", "train.dtype=fp32", "train.parallel=ddp")
    one = run_trial(trial, tmp_path / "one", log=lambda *_: None)
    _train(trial, tmp_path / "two", 2)
    two = TrialDir(tmp_path / "two").read_result()
    assert one.identity == trial.identity() != two["identity"] == trial.identity(2)
    assert one.steps == two["steps"] == 512
    assert math.isfinite(one.final_val_loss) and math.isfinite(two["final_val_loss"])
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert sorted(a) == sorted(b)
    parted = next((s for s in sorted(a) if "train/loss" in a[s] and abs(a[s]["train/loss"] - b[s]["train/loss"]) > 1e-4), None)
    print(f"512 steps, fp32: final val loss 1 worker {one.final_val_loss:.4f}, 2 workers {two['final_val_loss']:.4f} "
          f"({two['final_val_loss'] - one.final_val_loss:+.4f}); train losses part by > 1e-4 at step {parted}")


def test_a_split_that_does_not_divide_is_refused_in_one_line(trial_config):
    with pytest.raises(ConfigError) as e:
        check_split(trial_config(), 3)  # batch 4
    assert str(e.value) == ("train.batch_size=4 is invalid: must be divisible by ray.workers_per_trial=3 "
                            "(each worker trains an equal share of the global batch)")
    check_split(trial_config(), 2)
    with pytest.raises(ConfigError, match="train.parallel='zero' is invalid"):
        trial_config("train.parallel=zero")


@pytest.mark.slow  # about 3 minutes: three trials, Ray started twice
def test_a_sweep_trial_on_two_ray_train_workers_ends_as_on_one(tmp_path, data_cache):
    """The real CLI: the same settings as a 1-worker sweep and as a Ray Train run of 2 gloo workers
    (1 CPU each, ddp): two identities, the same losses over 20 steps, rank 0's folder, both
    ranks in trial.log, and the table's workers column."""
    from .conftest import run_cli

    args = ["-m", *TINY, *STEPS, "train.dtype=fp32", "ray.num_cpus=2", "hydra.sweeper.asha.enabled=false"]
    env = {"SMALLINIT_CACHE": str(data_cache)}
    one = run_cli([*args, "name=one"], cwd=tmp_path, env=env)
    assert one.returncode == 0, one.stderr[-3000:]
    # Two trials of 2 workers x 1 CPU on a 2-CPU Ray: they run one after the other.
    two = run_cli([*args, "name=two", "ray.workers_per_trial=2", "seed=0,1"], cwd=tmp_path, env=env)
    assert two.returncode == 0, two.stderr[-3000:]
    (a,), pair = (TrialDir.all_in_sweep(tmp_path / "sweeps" / name) for name in ("one", "two"))
    # The same settings on 2 workers: another identity (the worker count is part of it).
    (b,) = [d for d in pair if d.read_trial()["config"] == a.read_trial()["config"]]
    assert b.path.name != a.path.name and (a.read_trial()["workers"], b.read_trial()["workers"]) == (1, 2)
    first, second = sorted(pair, key=lambda d: d.trial_json.stat().st_mtime)
    assert first.result_json.stat().st_mtime <= second.trial_json.stat().st_mtime
    la, lb = _losses(a.path), _losses(b.path)
    assert sorted(la) == sorted(lb)
    for step, row in la.items():
        for key, value in row.items():
            assert lb[step][key] == pytest.approx(value, rel=1e-5), (step, key)
    log = b.log.read_text()
    for rank in (0, 1):  # once each: Ray Train's own copy of printed lines stays out
        assert log.count(f"[rank {rank}] rank {rank}/2 of trial {b.path.name}") == 1, log
        assert f"[rank {rank}] dtype: fp32" in log
    assert b.read_result()["steps"] == 20 and b.model_weights.exists()
    df = pd.read_parquet(tmp_path / "sweeps" / "two" / "results.parquet").set_index("config/train.seed")
    assert list(df["state"]) == ["COMPLETE"] * 2 and list(df["workers"]) == [2, 2]
    assert df.loc[0, "final_val_loss"] == pytest.approx(la[20]["val/loss"], rel=1e-5)


def test_workers_no_machine_can_hold_are_refused_before_ray_starts(tmp_path, data_cache):
    from .conftest import run_cli

    proc = run_cli(["-m", *TINY, "ray.num_cpus=2", "ray.workers_per_trial=4", "name=big"], cwd=tmp_path,
                   env={"SMALLINIT_CACHE": str(data_cache)})
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: ray.workers_per_trial=4 is invalid: 4 workers x ray.cpus_per_trial=1 need 4 CPUs and the local "
        "Ray has 2 CPUs (ray.num_cpus), so no trial could ever start; at most 2")
    assert not (tmp_path / "sweeps" / "big").exists()
