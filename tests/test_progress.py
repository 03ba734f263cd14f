"""The sweep's progress lines (sweeper/results/progress.py): done, running and failed of the total, and
an ETA from the measured times of this run's trials, each time a trial ends and every
HEARTBEAT_S seconds while none does. Driven by Tune's callbacks on stand-in trials and a clock
the test moves, then seen in a real two-trial sweep with its plan line."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest
from rich.console import Console

from smallinit.sweeper.results import progress
from smallinit.sweeper.results.progress import ProgressTable, Tally

from .conftest import sweep


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_eta_follows_the_measured_trial_times_and_how_many_run_at_once():
    clock = Clock()
    tally = Tally(total=8, skipped=1, clock=clock)  # 1 done before: 7 to run, 2 at a time
    tally.start("a")
    tally.start("b")
    assert tally.line() == "progress: 1/8 done, 2 running, 0 failed; ETA once a trial ends (0 s in)"
    clock.now += 120
    assert tally.end("a", failed=False)
    assert not tally.end("a", failed=False)  # an end is counted once
    # b has run 2 min of a 2 min mean: it ends now; 5 wait, 2 at a time: 3 rounds of 2 min.
    assert tally.eta_s() == pytest.approx(360)
    assert tally.line() == "progress: 2/8 done, 1 running, 0 failed; ETA 6 min (mean trial 2.0 min, 2 at a time)"
    tally.start("c")
    clock.now += 60
    tally.end("b", failed=True)  # a failure's time is not a trial's time
    assert tally.durations == [120]
    # c has 1 min left; 4 wait: c's slot takes 2 of them (1 + 2 + 2 min), the free one 2 (4 min).
    assert tally.eta_s() == pytest.approx(300)
    assert tally.line().startswith("progress: 2/8 done, 1 running, 1 failed; ETA 5 min (mean trial 2.0 min, 2 at a time)")


def test_a_trial_resumed_from_a_checkpoint_counts_as_a_whole_trial_at_its_step_rate():
    """A sweep restarted with a trial half trained: that trial's end comes after half a trial's
    time, which is not a trial's time (the crossover's restart said 'mean trial 3.8 min' for
    trials of 30). Its steps before this run are added back at the rate it reported."""
    clock = Clock()
    tally = Tally(total=3, clock=clock)
    tally.start("resumed")
    clock.now += 10  # loading its checkpoint
    tally.report("resumed", 600, total_steps=1000)  # it had ~500 steps: 100 more in the next 10 s
    clock.now += 40
    tally.report("resumed", 1000, total_steps=1000)  # 400 steps in 40 s: 10 steps/s
    # Running: its time left is its steps left at its rate, not the mean less its age.
    assert tally._time_left("resumed", tally.running["resumed"], now=clock.now) == pytest.approx(0)
    tally.end("resumed", failed=False)
    # 50 s in this run, and s1 - rate * (t1 - start) = 600 - 10 * 10 = 500 steps before it: +50 s.
    assert tally.durations == [pytest.approx(100)]
    tally.start("fresh")
    clock.now += 15  # 5 s of set-up, then 100 steps
    tally.report("fresh", 100, total_steps=1000)
    clock.now += 10
    tally.report("fresh", 200, total_steps=1000)
    # 800 steps left at 10 steps/s; the one waiting follows at the mean (100 s).
    assert tally.eta_s() == pytest.approx(80 + 100)
    assert tally.line().startswith("progress: 1/3 done, 1 running (at 20%), 0 failed; ETA 3 min")
    clock.now += 80
    tally.report("fresh", 150, total_steps=1000)  # a budget branch's row, behind the main run: not progress
    tally.report("fresh", 1000, total_steps=1000)
    tally.end("fresh", failed=False)
    assert tally.durations[1] == pytest.approx(105)  # a fresh start: its own start-to-end time


def test_the_last_trials_of_a_resumed_sweep_are_timed_by_their_step_rates_before_any_ends():
    """The widths check restarted with 22 of 24 done and its last 2 resumed: no trial of this run
    had ended, so for half an hour the line said only 'ETA once a trial ends'. With nothing
    waiting and every running trial at a measured rate, their steps left give the ETA."""
    clock = Clock()
    tally = Tally(total=24, skipped=22, clock=clock)
    tally.start("a")
    tally.start("b")
    clock.now += 30
    tally.report("a", 100, total_steps=1000)
    tally.report("b", 50, total_steps=1000)
    assert tally.eta_s() is None  # one report each: no rate yet
    clock.now += 10
    tally.report("a", 200, total_steps=1000)  # 10 steps/s: 800 left, 80 s
    tally.report("b", 100, total_steps=1000)  # 5 steps/s: 900 left, 180 s
    assert tally.eta_s() == pytest.approx(180)
    assert tally.line() == ("progress: 22/24 done, 2 running (at 20%, 10%), 0 failed; "
                            "ETA 3 min (the running trials at their step rates)")
    assert Tally(total=25, skipped=22, clock=clock).eta_s() is None  # one waits: its time is unknown


def test_trials_of_other_sizes_are_weighted_by_their_flops():
    """A grid of two widths, the small ones first (the widths check: d = 96, then d = 192 at about
    2.9 times the FLOPs): the mean of the small trials alone would put the end far too early."""
    clock = Clock()
    tally = Tally(total=5, skipped=1, clock=clock, costs=[1.0, 1.0, 2.5, 2.5])
    tally.start("s1", 1.0)
    tally.start("s2", 1.0)
    clock.now += 600
    tally.end("s1", failed=False)
    tally.end("s2", failed=False)
    # 600 s per unit of cost; two of 2.5 left, 2 at a time: 1,500 s, not the small ones' 600.
    assert tally.eta_s() == pytest.approx(1500)
    assert tally.line() == ("progress: 3/5 done, 0 running, 0 failed; ETA 25 min (mean trial 10 min, trials left "
                            "weighted by their FLOPs, 2 at a time)")
    tally.start("b1", 2.5)
    clock.now += 300
    # b1 is 300 s into its 1,500; b2 waits for the free slot: 1,500 s from now.
    assert tally.eta_s() == pytest.approx(1500)
    # A trial the plan did not hold (a new search sample) weighs the planned ones' mean.
    tally.start("new")
    assert tally.cost["new"] == pytest.approx(2.5) and tally.to_start == []


def test_only_the_training_steps_scale_with_flops_not_a_trials_set_up():
    """Tiny trials are mostly set-up and the last evaluation: scaling their whole time by FLOPs
    would put a 4 times larger trial at 40 s where it takes 16."""
    clock = Clock()
    tally = Tally(total=2, clock=clock, costs=[1.0, 4.0])
    tally.start("small", 1.0)
    clock.now += 6  # set-up
    tally.report("small", 0, total_steps=100)
    clock.now += 2
    tally.report("small", 100, total_steps=100)  # 50 steps/s: 2 s of training
    clock.now += 2  # the last evaluation
    tally.end("small", failed=False)
    assert tally.durations == [10] and tally.overheads == [pytest.approx(8)]
    assert tally.eta_s() == pytest.approx(8 + 2 * 4)


def test_a_trial_cost_is_its_training_flops_per_worker(monkeypatch):
    spec = SimpleNamespace(trial=SimpleNamespace(train=SimpleNamespace(total_steps=10, tokens_per_step=64)), workers=2)
    monkeypatch.setattr(progress, "flops_per_token", lambda trial: 1e6)
    assert progress.trial_cost(spec) == pytest.approx(1e6 * 10 * 64 / 2)


def test_the_last_line_has_no_eta_and_times_read_in_seconds_minutes_or_hours():
    clock = Clock()
    tally = Tally(total=1, clock=clock)
    tally.start("a")
    clock.now += 30
    tally.end("a", failed=False)
    assert tally.line() == "progress: 1/1 done, 0 running, 0 failed"
    assert [progress._minutes(s, 1) for s in (40, 114, 1200, 3 * 3600)] == ["40 s", "1.9 min", "20 min", "3.0 h"]


def _trial(trial_id: str, number: int, failed: bool = False):
    spec = SimpleNamespace(params={"init.gamma": number / 2}, trial=SimpleNamespace(train=SimpleNamespace(total_steps=8)))
    return SimpleNamespace(trial_id=trial_id, config={"spec": spec, "number": number},
                           last_result={"failed": failed, "done_training": not failed, "val_loss": 5.0, "step": 8})


def test_a_line_each_time_a_trial_ends_and_every_minute_while_none_does():
    table = ProgressTable(["init.gamma"], total=3)
    clock = Clock()
    table.tally = Tally(3, clock=clock)
    table.cost_of = lambda spec: None  # stand-in specs: every trial weighs the same
    table.console = Console(file=io.StringIO(), width=300)  # not a terminal: lines, not a live table
    a, b, c = _trial("a", 0), _trial("b", 1), _trial("c", 2, failed=True)
    for t in (a, b):
        table.on_trial_start(0, [], t)
    clock.now += 59
    table.on_step_end(0, [])  # under a minute since the start: silent
    clock.now += 1
    table.on_step_end(0, [])
    clock.now += 30
    table.on_trial_complete(0, [], a)
    table.on_trial_start(0, [], c)
    clock.now += 60
    table.on_step_end(0, [])
    table.on_trial_complete(0, [], b)
    table.on_trial_complete(0, [], c)
    lines = [line for line in table.console.file.getvalue().splitlines() if line.startswith("progress:")]
    assert lines == [
        "progress: 0/3 done, 2 running, 0 failed; ETA once a trial ends (60 s in)",
        "progress: 1/3 done, 1 running, 0 failed; ETA 2 min (mean trial 1.5 min, 2 at a time)",  # b, then c
        "progress: 1/3 done, 2 running, 0 failed; ETA 30 s (mean trial 1.5 min, 2 at a time)",  # the heartbeat
        "progress: 2/3 done, 1 running, 0 failed; ETA 60 s (mean trial 2.0 min, 2 at a time)",
        "progress: 2/3 done, 0 running, 1 failed",
    ]


def test_a_trial_line_is_one_line_in_a_log_however_many_keys_it_names():
    table = ProgressTable(["arm", "optim.lr", "train.stop_after", "seed"], total=1)
    table.console = Console(file=io.StringIO(), width=80)  # a log: rich's default width off a terminal
    table.cost_of = lambda spec: None  # a stand-in spec
    trial = _trial("a", 4)
    trial.config["spec"].params = {"arm": "baseline", "optim.lr": 0.001, "train.stop_after": 1048576, "seed": 1}
    table.on_trial_start(0, [], trial)
    table.on_trial_complete(0, [], trial)
    assert "trial 4 COMPLETE arm=baseline optim.lr=0.001 train.stop_after=1048576 seed=1 val_loss=5.0000" in (
        table.console.file.getvalue().splitlines())


def test_a_real_sweep_says_what_it_will_run_and_how_far_it_got(tmp_path, data_cache):
    proc = sweep(tmp_path, data_cache, "init.gamma=0.5,1.0", "wandb.mode=disabled", "name=prog")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sweep prog: grid, 2 trials (0 already done); to run: 0 resume from a checkpoint, 2 new; folder " in proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.startswith("progress:")]
    assert lines[-1] == "progress: 2/2 done, 0 running, 0 failed", proc.stdout
    # The first end (a heartbeat may come before it on a slow machine), with the ETA it measured.
    first = next(line for line in lines if line.startswith("progress: 1/2"))
    assert re.fullmatch(r"progress: 1/2 done, 1 running( \(at [0-9]+%\))?, 0 failed; ETA [0-9.]+ (s|min) "
                        r"\(mean trial [0-9.]+ (s|min), [12] at a time\)", first), first
    again = sweep(tmp_path, data_cache, "init.gamma=0.5,1.0", "wandb.mode=disabled", "name=prog")
    assert again.returncode == 0 and "2 trials (2 already done); nothing to run; folder " in again.stdout
