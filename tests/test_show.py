"""`sweep.py --show`: the steps a trial with several budgets really trains, the plan's cost, the
time it would take here (sweeper/results/estimate.py), and train.budgets_per_param (budgets that differ
by model size within one sweep)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from smallinit.core.errors import ConfigError
from smallinit.sweeper.results import estimate
from smallinit.sweeper.results.show import _memory, _torch_side, trained_steps

from .conftest import run_cli

WSD = "optim.schedule=wsd"


def test_trained_steps_count_every_cooldown_branch(trial_config):
    # TINY trains 128 tokens a step: budgets of 10, 20 and 22 steps, cooldowns of 2, 4 and 4.
    # The run trains the largest budget's 22 steps (its cooldown is the run's own end), and
    # the smaller budgets' cooldowns on the side: 22 + 2 + 4.
    trial = trial_config(WSD, "train.budgets=[1280,2560,2816]")
    assert trained_steps(trial.train) == 28
    assert trained_steps(trial_config(WSD, "train.budgets=[1280,2560,2816]", "train.cooldown_frac=0.5").train) == 22 + 5 + 10
    assert trained_steps(trial_config(WSD, "train.budgets=[2816]").train) == 22  # one budget: no side branch
    assert trained_steps(trial_config().train) == trial_config().train.total_steps == 8  # no budgets


def test_budgets_per_param_are_each_sizes_own_budgets_in_whole_steps(trial_config):
    trial = trial_config(WSD, "train.budgets_per_param=[5,10,20]")
    n = trial.model.num_params(active=True)  # counted as train.tokens_per_param counts
    expected = tuple(int(k * n) // 128 * 128 for k in (5, 10, 20))
    assert trial.train.budgets == expected and trial.train.max_tokens == expected[-1]
    assert trial.train.budgets_per_param is None
    # Given per parameter or in tokens, it is the same trial (and the same identity it always had).
    same = trial_config(WSD, f"train.budgets=[{','.join(map(str, expected))}]")
    assert trial.identity() == same.identity() and trial == same
    wider = trial_config(WSD, "train.budgets_per_param=[5,10,20]", "model.d_model=256")
    assert wider.train.budgets[0] > trial.train.budgets[0]


@pytest.mark.parametrize("overrides, message", [
    ((WSD, "train.budgets_per_param=[10,5]"),
     "train.budgets_per_param=[10, 5] is invalid: a strictly increasing list of positive numbers"),
    ((WSD, "train.budgets_per_param=[0,5]"), "train.budgets_per_param=[0, 5] is invalid"),
    ((WSD, "train.budgets_per_param=[5,10]", "train.budgets=[1280,2560]"),
     "train.budgets=[1280, 2560] is invalid: must be null with train.budgets_per_param"),
    ((WSD, "train.budgets_per_param=[5,10]", "train.tokens_per_param=20"),
     "train.tokens_per_param=20 is invalid: must be null with train.budgets_per_param"),
    (("train.budgets_per_param=[5,10]",), "optim.schedule='cosine' is invalid: must be wsd with train.budgets"),
])
def test_bad_budgets_per_param_are_one_line_errors(trial_config, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")) as e:
        trial_config(*overrides)
    assert "\n" not in str(e.value)


@pytest.mark.slow  # make test stays under 10 min on 2 cores; CI runs it after
def test_gpu_scaling_law_composes_and_shows_its_plan_and_cost(tmp_path, data_cache, compose):
    from smallinit.sweeper.runtime.resources import trial_workers
    from smallinit.trainer.config import flops_per_token, trial_config_from_dict

    tokens = tmp_path / "train.bin"
    np.random.default_rng(0).integers(0, 32768, 50_000).astype(np.uint16).tofile(tokens)
    proc = run_cli(["--show", "-m", "+experiment=gpu/scaling_law", f"data.paths={tokens}"], cwd=tmp_path,
                   env={"SMALLINIT_CACHE": str(data_cache)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "# with -m: 30 trial(s), grid" in out  # 5 presets x 2 arms x 3 lrs on the tuning seed
    assert "stage 1 (tune): 10 setting(s) x optim.lr=0.0003,0.001,0.003 x seed in [100] = 30 trials" in out
    assert "stage 2 (confirm): 10 setting(s)" in out and "seed in [1, 2, 3, 4] = 40 trials" in out
    # Each (preset, arm) composed on its own: budgets of 5, 10, 20 tokens per parameter of the
    # shape in whole steps of 32 x 2048, the same for both arms; 3 lrs each.
    tps, total, flops = 32 * 2048, 0, 0.0
    for preset in ("0.1b", "0.25b", "0.5b", "1b", "1.5b"):
        arms = [trial_config_from_dict(compose("+experiment=gpu/scaling_law", f"data.paths={tokens}",
                                               f"model={preset}", f"arm={arm}", tiny=False))
                for arm in ("baseline", "small")]
        n = arms[0].model.num_params(active=True)
        steps = [int(k * n) // tps for k in (5, 10, 20)]
        assert arms[0].train.budgets == arms[1].train.budgets == tuple(s * tps for s in steps)
        trained = steps[2] + int(0.2 * steps[0]) + int(0.2 * steps[1])  # the 20x run and two cooldowns
        total += 3 * 2 * trained * tps
        flops += 3 * sum(trained * tps * flops_per_token(t) for t in arms)
        if preset == "0.1b":
            assert f"0.1b, 101.43M parameters (101.43M active), {trained} steps x {tps} tokens" in out
        # ray.fit_device_gib=80: each size on its own worker count, one memory line per shape.
        workers = trial_workers(arms[0], {"fit_device_gib": 80, "gpus_per_trial": 1})
        how = "1 worker, bf16" if workers == 1 else f"{workers} workers, fsdp, bf16"
        lines = [line for line in out.splitlines() if f"({preset}): memory per device" in line]
        assert len(lines) == 2 and all(f"memory per device ({how})" in line for line in lines), lines
        assert (workers == 1) == (preset == "0.1b")  # 1b and 1.5b above all need several
    line = next(line for line in out.splitlines() if line.startswith("# cost of"))
    assert line.startswith(f"# cost of stage 1 (its first round): 30 trials, {total:,} tokens trained, ")
    assert float(line.split(" tokens trained, ")[1].split()[0]) == pytest.approx(flops, rel=5e-3)  # printed to 3 digits


def test_memory_lines_from_the_child_process_equal_those_worked_out_here(trial_config):
    trials = [trial_config(), trial_config("model.d_model=64"), trial_config("init.gamma=1.0")]
    runs_on = [(1, False)] * 3
    here = _memory(trials, runs_on)
    assert len(here) == 2 and here[0].startswith("# 2 trial(s) like ")  # two shapes: gamma is not one
    assert _memory(trials, runs_on, _torch_side()) == here
    dead = _torch_side()
    dead.kill()
    dead.wait()
    assert _memory(trials, runs_on, dead) == here  # a child that died: worked out here instead


@pytest.mark.slow  # make test stays under 10 min on 2 cores; CI runs it after
def test_show_leaves_torch_to_the_child(tmp_path):
    """--show's own process never imports torch (~5 s with the meta-device trace): the points
    are built while a child works out the memory lines."""
    import subprocess
    import sys

    from .conftest import REPO

    out = subprocess.run([sys.executable, "-X", "importtime", "sweep.py", "--show", "-m", "train.seed=1,2,3",
                          f"hydra.sweep.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "# each trial: memory per device (1 worker, " in out.stdout and out.stdout.count("\n#   ") == 3
    # Timed on this CPU in the child: one line of the time per trial and for the grid; nothing written.
    assert re.search(r"^# estimated time: ~[0-9.]+ min per trial on this machine \(measured [0-9,]+ tokens/s, "
                     r"(bf16|fp32), 1 thread\), ~[0-9.]+ (min|h) for the grid at [123] at a time$", out.stdout, re.M), out.stdout
    assert list(tmp_path.iterdir()) == []
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    assert "hydra" in imported and "torch" not in imported


def test_the_time_estimate_counts_training_and_evaluation_tokens_scaled_by_flops(trial_config):
    from smallinit.trainer.config import flops_per_token

    trial = trial_config()  # TINY: 8 steps of 128 tokens, evaluated at 0, 4 and 8 on 512 tokens
    assert estimate.eval_tokens(trial) == 3 * 512 + 256
    with_budgets = trial_config(WSD, "train.budgets=[640,1024]")  # one more evaluation: the 640 branch's end
    assert estimate.eval_tokens(with_budgets) == 4 * 512 + 256
    rate = estimate.Rate(1000.0, 3000.0, flops_per_token(trial), 1, "fp32")
    assert rate.seconds(trial, 1024) == pytest.approx(1024 / 1000 + 1792 / 3000)
    wide = trial_config("model=micro")
    ratio = flops_per_token(wide) / flops_per_token(trial)
    assert ratio > 1.5 and rate.seconds(wide, 1024) == pytest.approx(ratio * rate.seconds(trial, 1024))
    assert estimate.makespan([60.0] * 8, 2) == 240 and estimate.makespan([30.0, 90.0, 60.0], 2) == 90
    line = estimate.line(rate, [300.0] * 8, 2, "the grid")
    assert line == ("# estimated time: ~5.0 min per trial on this machine (measured 1,000 tokens/s, fp32, 1 thread), "
                    "~20 min for the grid at 2 at a time")
    assert estimate.line(rate, [300.0] * 1000, 2, "the grid").endswith(", ~42 h for the grid at 2 at a time")
    assert estimate.line(rate, [60.0, 120.0], None, "the grid").endswith(
        "~1.0 min to 2.0 min per trial on this machine (measured 1,000 tokens/s, fp32, 1 thread), ~3.0 min for the grid "
        "one at a time (ray.address: the cluster sets how many at once)")


def test_trials_run_at_once_and_what_is_not_timed_here(trial_config):
    assert estimate.at_a_time({"num_cpus": 4}, None, 1, 8) == 4
    assert estimate.at_a_time({"num_cpus": 4, "cpus_per_trial": 2}, None, 1, 8) == 2
    assert estimate.at_a_time({"num_cpus": 4}, 1, 1, 8) == 1 and estimate.at_a_time({"num_cpus": 4}, None, 1, 3) == 3
    assert estimate.at_a_time({"num_cpus": 4}, None, 4, 8) == 1  # 4 workers of one CPU each
    assert estimate.at_a_time({"address": "auto"}, None, 1, 8) is None
    trial = trial_config()
    assert estimate.not_measured(trial, 1, False) is None
    assert "GPU" in estimate.not_measured(trial, 1, True) and "2 workers" in estimate.not_measured(trial, 2, False)
    assert "too large" in estimate.not_measured(trial_config("model=1.5b"), 1, False)


def test_the_timing_is_short_and_real(trial_config):
    import time

    start = time.perf_counter()
    rate = estimate.measure(trial_config(), threads=1, budget_s=0.3)
    assert time.perf_counter() - start < 30  # a warm-up step, 2 timed of each kind, then 0.3 s
    assert rate.train_tokens_per_s > 0 and rate.eval_tokens_per_s > rate.train_tokens_per_s / 10
    assert rate.threads == 1 and rate.dtype in ("fp32", "bf16")
