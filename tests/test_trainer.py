"""The training loop: budgets, schedule, determinism, resume, divergence, outputs, the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from smallinit.core.trial_dir import TrialDir
from smallinit.model import ConfigError
from smallinit.trainer.config import OptimConfig, trial_config_from_dict
from smallinit.trainer.loop import TrialDiverged, flops_per_token, lr_at, run_trial

from .conftest import StopAt, run_cli


def _losses(out_dir):
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("train/loss"), r.get("val/loss")) for r in rows]


def test_lr_schedules_follow_their_shapes():
    total = 100
    cos = OptimConfig(lr=1.0, warmup_frac=0.1, min_lr_ratio=0.1, schedule="cosine")
    lrs = [lr_at(s, total, cos) for s in range(total)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)  # linear warmup over 10 steps
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))  # then non-increasing
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)
    wsd = OptimConfig(lr=1.0, warmup_frac=0.0, decay_frac=0.2, min_lr_ratio=0.0, schedule="wsd")
    lrs = [lr_at(s, total, wsd) for s in range(total)]
    assert lrs[:80] == [1.0] * 80 and lrs[90] == pytest.approx(0.5) and lrs[99] == pytest.approx(0.05)


def test_budget_in_tokens_or_steps(trial_config):
    t = trial_config("train.max_tokens=4096").train
    assert t.total_steps == 4096 // (4 * 32)
    assert trial_config("train.max_steps=3").train.total_steps == 3
    with pytest.raises(ConfigError, match="train.max_tokens"):
        trial_config("train.max_tokens=0")


def test_flops_formula_matches_palm(trial_config):
    trial = trial_config()
    m = trial.model
    n_matmul = m.num_params() - 0  # nano ties its embeddings: the LM head matmul counts
    assert flops_per_token(trial) == 6 * n_matmul + 12 * m.n_layers * m.d_model * trial.train.seq_len


def test_same_config_same_curve(trial_config, tmp_path):
    trial = trial_config()
    run_trial(trial, tmp_path / "a", log=lambda *_: None)
    run_trial(trial, tmp_path / "b", log=lambda *_: None)
    assert _losses(tmp_path / "a") == _losses(tmp_path / "b")
    assert _losses(tmp_path / "a")[-1][2] is not None


def test_outputs_of_a_trial(trial_config, tmp_path):
    trial = trial_config()
    result = run_trial(trial, tmp_path, log=lambda *_: None)
    assert TrialDir(tmp_path).read_result()["identity"] == trial.identity() == result.identity
    assert result.steps == 8 and result.tokens == 1024 and result.n_params == trial.model.num_params()
    per_token = np.load(tmp_path / "per_token_losses.npz")
    assert per_token["loss"].shape == per_token["targets"].shape == (256,)
    # The saved per-token losses average to the loss the model gives that slice.
    assert np.isfinite(per_token["loss"]).all() and 0 < per_token["loss"].mean() < 10
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 4, 5, 8]  # evaluations every 4, a training row every 5
    evaluations = [m for m in metrics if "val/loss" in m]
    assert [m["step"] for m in evaluations] == [0, 4, 8]
    assert all("stable_rank/mean" in m and "attn_sink/mean" in m for m in evaluations)
    assert sorted(p.name for p in (tmp_path / "probes").iterdir()) == ["step_0000000.npz", "step_0000004.npz", "step_0000008.npz"]
    # Finished: final weights kept, optimizer checkpoint dropped, and a rerun trains nothing.
    assert (tmp_path / "model.pt").exists() and not (tmp_path / "checkpoint.pt").exists()
    before = (tmp_path / "metrics.jsonl").stat().st_mtime_ns
    again = run_trial(trial, tmp_path, log=lambda *_: None)
    assert again.final_val_loss == result.final_val_loss
    assert (tmp_path / "metrics.jsonl").stat().st_mtime_ns == before


def test_resume_gives_the_same_final_loss(trial_config, tmp_path):
    trial = trial_config("train.max_tokens=2048")  # 16 steps, checkpoints every 4
    straight = run_trial(trial, tmp_path / "straight", log=lambda *_: None)
    with pytest.raises(KeyboardInterrupt):
        run_trial(trial, tmp_path / "resumed", reporter=StopAt(9), log=lambda *_: None)
    assert TrialDir(tmp_path / "resumed").read_result() is None
    resumed = run_trial(trial, tmp_path / "resumed", log=lambda *_: None)
    assert resumed.final_val_loss == straight.final_val_loss
    assert _losses(tmp_path / "resumed") == _losses(tmp_path / "straight")  # no step logged twice


def test_divergence_stops_with_the_step(trial_config, tmp_path):
    trial = trial_config("optim.lr=1e12", "optim.grad_clip=null", "optim.warmup_frac=0", "train.max_steps=50")
    with pytest.raises(TrialDiverged, match=r"diverged at step \d+"):
        run_trial(trial, tmp_path, log=lambda *_: None)


def test_reading_the_loss_every_few_steps_logs_the_same_curve(trial_config, tmp_path, monkeypatch):
    """The accelerator path (loss kept on the device, read every few steps), run on the CPU:
    the same logged curve, and a divergence still stops the trial, naming the steps."""
    import smallinit.trainer.loop as loop

    trial = trial_config("train.max_steps=12", "train.eval_every=6", "train.ckpt_every=5")
    run_trial(trial, tmp_path / "every", log=lambda *_: None)
    monkeypatch.setattr(loop, "_sync_every", lambda device: 4)
    run_trial(trial, tmp_path / "fourth", log=lambda *_: None)
    for a, b in zip(_losses(tmp_path / "every"), _losses(tmp_path / "fourth"), strict=True):
        assert a[0] == b[0] and a[2] == b[2]
        assert (a[1] is None and b[1] is None) or a[1] == pytest.approx(b[1], rel=1e-6)
    bad = trial_config("optim.lr=1e12", "optim.grad_clip=null", "optim.warmup_frac=0", "train.max_steps=50")
    with pytest.raises(TrialDiverged, match=r"diverged at (step \d+|a step in \d+-\d+ \(read every \d\))"):
        run_trial(bad, tmp_path / "bad", log=lambda *_: None)


def test_tiny_lm_learns_below_unigram_entropy(trial_config, tmp_path):
    trial = trial_config("train.max_tokens=40960", "train.batch_size=8", "train.seq_len=64",
                         "train.eval_every=40", "train.eval_tokens=8192", "train.probe_every=0")
    result = run_trial(trial, tmp_path, log=lambda *_: None)
    assert result.unigram_entropy == pytest.approx(7.22, abs=0.05)
    assert result.final_val_loss < result.unigram_entropy - 0.3


@pytest.mark.slow
def test_anchor_task_reaches_high_in_distribution_accuracy(trial_config, tmp_path):
    # Measured: at lr 3e-3 in-distribution accuracy passes 0.9 near step 400 (0.98 by 600).
    trial = trial_config("data=anchor", "train=anchor", "train.max_steps=600", "train.eval_every=600",
                         "train.probe_every=0", "train.batch_size=100", "train.seq_len=8", "optim.schedule=constant",
                         "optim.lr=3e-3", "init.gamma=0.5")
    result = run_trial(trial, tmp_path, log=lambda *_: None)
    acc = result.final_metrics["anchor/in_dist_acc"]
    assert acc > 0.9, result.final_metrics
    assert result.final_metrics["anchor/inferential_acc"] + result.final_metrics["anchor/symmetric_acc"] <= 1.0


def test_cli_single_run_prints_loss_and_outputs(data_cache, tmp_path):
    from .conftest import TINY

    proc = run_cli([*TINY, "hydra.run.dir=run"], cwd=tmp_path, env={"SMALLINIT_CACHE": str(data_cache)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "unigram entropy" in proc.stdout and "outputs in" in proc.stdout
    assert TrialDir(tmp_path / "run").read_result()["steps"] == 8
    # wandb.* is accepted here too, so the run says that only a sweep's trials go to W&B.
    assert (f"W&B: disabled for a single run (a sweep, sweep.py -m, logs one W&B run per trial); metrics in "
            f"{tmp_path / 'run' / 'metrics.jsonl'}") in proc.stdout.splitlines()


def test_cli_rejects_bad_values_in_one_line(data_cache, tmp_path):
    proc = run_cli(["init.gamma=-1", "wandb.mode=disabled"], cwd=tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == "error: init.gamma=-1 is invalid: must be > 0"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("result.json"))


def test_identity_ignores_hardware_and_paths(trial_config):
    a = trial_config()
    b = trial_config("train.threads=2", "train.device=cpu", "data.cache_dir=/elsewhere")
    c = trial_config("init.gamma=0.5")
    assert a.identity() == b.identity() != c.identity()
    assert trial_config("train.keep_weights=false").identity() == a.identity()


def test_a_trial_that_keeps_no_weights_is_finished_without_them(trial_config, tmp_path):
    """train.keep_weights=false: no model.pt, none listed in result.json, so the folder's small
    files alone are a finished trial (a rerun trains nothing); export says why it cannot."""
    from smallinit.trainer.export import export

    trial = trial_config("train.keep_weights=false")
    result = run_trial(trial, tmp_path / "t", log=lambda *_: None)
    folder = TrialDir(tmp_path / "t")
    assert not folder.model_weights.exists() and "model.pt" not in folder.read_result()["files"]
    assert folder.changed_files() == {}
    before = (tmp_path / "t" / "metrics.jsonl").stat().st_mtime_ns
    assert run_trial(trial, tmp_path / "t", log=lambda *_: None).final_val_loss == result.final_val_loss
    assert (tmp_path / "t" / "metrics.jsonl").stat().st_mtime_ns == before
    with pytest.raises(ConfigError, match="train.keep_weights=false, so it kept no weights to export"):
        export(tmp_path / "t", tmp_path / "hf")


def test_model_vocab_follows_the_data(compose):
    cfg = compose("data.vocab_size=2048")
    assert trial_config_from_dict(cfg).model.vocab_size == 2048
    with pytest.raises(ConfigError, match="model.vocab_size"):
        trial_config_from_dict(compose("data.vocab_size=2048", "model.vocab_size=1000"))


def test_mfu_is_reported_only_with_a_peak(trial_config, tmp_path):
    result = run_trial(trial_config("train.peak_tflops=1.0"), tmp_path, log=lambda *_: None)
    assert result.mfu is not None and 0 < result.mfu < 1
    assert math.isclose(result.mfu, result.tokens_per_s * flops_per_token(trial_config()) / 1e12, rel_tol=1e-9)
    assert torch.get_num_threads() == 1  # train.threads=1 applied


@pytest.mark.slow
def test_default_micro_trial_learns_well_below_unigram_entropy(data_cache, tmp_path):
    """The default trial, exactly as `python sweep.py` runs it (about a minute on 2 cores)."""
    proc = run_cli(["hydra.run.dir=run", "wandb.mode=disabled"], cwd=tmp_path, env={"SMALLINIT_CACHE": str(data_cache)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = TrialDir(tmp_path / "run").read_result()
    assert result["n_params"] > 5e6 and result["tokens"] == 122_880
    assert result["final_val_loss"] < result["unigram_entropy"] - 0.5, result


@pytest.mark.slow
def test_torch_compile_matches_eager(trial_config, tmp_path):
    eager = run_trial(trial_config(), tmp_path / "eager", log=lambda *_: None)
    compiled = run_trial(trial_config("train.compile=true"), tmp_path / "compiled", log=lambda *_: None)
    assert compiled.final_val_loss == pytest.approx(eager.final_val_loss, abs=2e-3)


def test_training_rows_follow_log_every_and_evaluation_keeps_its_cadence(trial_config, tmp_path):
    trial = trial_config("train.max_tokens=1280", "train.log_every=3", "train.eval_every=5", "train.probe_every=0")
    run_trial(trial, tmp_path, log=lambda *_: None)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [3, 5, 6, 9, 10]
    assert [r["step"] for r in rows if "val/loss" in r] == [0, 5, 10]
    assert all({"train/lr", "train/grad_norm", "perf/tokens_per_s"} <= set(r) for r in rows if "train/loss" in r)
    # Logging density is not part of what a trial is: the same trial, logged differently.
    assert trial.identity() == trial_config("train.max_tokens=1280", "train.log_every=0", "train.eval_every=5",
                                            "train.probe_every=0").identity()


def test_a_result_names_the_machine_commit_and_threads_that_made_it(trial_config, tmp_path):
    """One identity on two CPUs is not bit-identical (measured: 1e-8 apart at step 0 on the
    crossover's micro model, 0.01 nats by step 300), so result.json says what made it."""
    from importlib import metadata

    from smallinit.core.provenance import cpu_identity, git_state

    run_trial(trial_config("train.max_tokens=512", "train.threads=1"), tmp_path, log=lambda *_: None)
    made_by = TrialDir(tmp_path).read_result()["made_by"]
    assert made_by["machine"]["cpu_model"] == cpu_identity()[0]
    assert made_by["threads"] == 1 and made_by["workers"] == 1
    assert made_by["packages"]["torch"] == metadata.version("torch")
    assert made_by["commit"] == git_state()[0]


def test_the_trainer_reads_the_identity_it_is_given_and_never_computes_it(trial_config, tmp_path, monkeypatch):
    """A sweep's driver computes each trial's identity once (TrialSpec); the trainer carries it into
    every record it writes and checks the folder against it."""
    from smallinit.core.trial_dir import TrialDir
    from smallinit.trainer.config import TrialConfig
    from smallinit.trainer.loop import run_trial

    trial = trial_config("train.max_tokens=256")
    identity = trial.identity()

    def computed(self, *a, **k):
        raise AssertionError("the trainer computed the identity again")

    monkeypatch.setattr(TrialConfig, "identity", computed)
    result = run_trial(trial, tmp_path / "t", log=lambda *_: None, identity=identity)
    folder = TrialDir(tmp_path / "t")
    assert result.identity == folder.read_trial()["identity"] == folder.read_result()["identity"] == identity
    assert run_trial(trial, tmp_path / "t", log=lambda *_: None, identity=identity).identity == identity  # finished: read
