"""Select, then confirm (sweeper/config/protocol.py): the tuning choice, the edge extension, the
confirm round, and a real sweep killed inside each stage that resumes without training twice."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import optuna
import pandas as pd
import pytest

from smallinit.core import results_schema as schema
from smallinit.core.errors import ConfigError
from smallinit.sweeper.config import protocol
from smallinit.sweeper.config.config import ProtocolConf
from smallinit.sweeper.config.space import parse_sweep

from .conftest import REPO, TINY, study_trials, sweep

CONF = ProtocolConf(tune=["optim.lr"], tune_seeds=[100], confirm_seeds=[1, 2])


def curve(best_lr: float, width: float = 1.0):
    """A loss that is lowest at best_lr (quadratic in log lr), the same on every seed."""
    import math

    return lambda p: 3.0 + width * (math.log10(p["optim.lr"]) - math.log10(best_lr)) ** 2


def test_an_interior_choice_needs_no_extension():
    todo, choice = protocol.settle(CONF, {"arm": "a"}, {"optim.lr": [1e-3, 3e-3, 1e-2]}, curve(3e-3))
    assert todo == [] and choice.chosen == {"optim.lr": 3e-3} and choice.extensions == 0 and choice.at_edge == []


def test_a_choice_at_the_edge_extends_one_step_at_a_time_until_inside():
    ran: list[float] = []
    loss = curve(0.05)
    seen: set[float] = set()

    def outcome(p):  # every point pending until the driver "runs" it
        if p["optim.lr"] not in seen:
            return protocol.PENDING
        return loss(p)

    grid = {"optim.lr": [1e-3, 3e-3, 1e-2]}
    while True:
        todo, choice = protocol.settle(CONF, {}, grid, outcome)
        if choice is not None:
            break
        ran.append(sorted({p["optim.lr"] for p in todo}))
        seen.update(p["optim.lr"] for p in todo)
    # 1e-2 at the top edge: 1e-2 * (1e-2 / 3e-3) = 0.0333; then 0.111; 0.0333 is then inside.
    assert ran == [[1e-3, 3e-3, 1e-2], [0.0333333], [0.111111]]
    assert choice.chosen == {"optim.lr": 0.0333333} and choice.extensions == 2 and choice.at_edge == []


def test_extensions_stop_at_the_limit_and_say_the_choice_is_at_the_edge():
    conf = ProtocolConf(tune=["optim.lr"], tune_seeds=[100], confirm_seeds=[1], max_extensions=2)
    todo, choice = protocol.settle(conf, {}, {"optim.lr": [1e-3, 1e-2]}, curve(10.0))
    assert todo == [] and choice.tried == {"optim.lr": [1e-3, 1e-2, 0.1, 1.0]}
    assert choice.chosen == {"optim.lr": 1.0} and choice.at_edge == ["optim.lr"]


def test_the_choice_is_the_lowest_mean_over_tuning_seeds_and_skips_failed_values():
    conf = ProtocolConf(tune=["optim.lr"], tune_seeds=[7, 8], confirm_seeds=[1], max_extensions=0)
    losses = {(1e-3, 7): 4.0, (1e-3, 8): 4.2, (3e-3, 7): 3.9, (3e-3, 8): 4.5, (1e-2, 7): 1.0, (1e-2, 8): None}
    todo, choice = protocol.settle(conf, {}, {"optim.lr": [1e-3, 3e-3, 1e-2]},
                                   lambda p: losses[p["optim.lr"], p["seed"]])
    # 1e-2 diverged on one seed: out. Means 4.1 (1e-3) and 4.2 (3e-3).
    assert choice.chosen == {"optim.lr": 1e-3}
    assert [m for _, m in choice.means] == pytest.approx([4.1, 4.2])
    assert protocol.confirm_points(conf, [choice]) == [{"optim.lr": 1e-3, "seed": 1}]


def test_a_setting_with_no_complete_value_is_not_confirmed():
    todo, choice = protocol.settle(CONF, {"arm": "a"}, {"optim.lr": [1e-3, 1e-2]}, lambda p: None)
    assert choice.chosen is None and protocol.confirm_points(CONF, [choice]) == []


def test_step_past_keeps_the_edge_ratio_and_integers_stay_integers():
    assert protocol.step_past([1e-3, 3e-3, 1e-2], "low") == pytest.approx(3.33333e-4)
    assert protocol.step_past([100, 200], "high") == 400 and isinstance(protocol.step_past([100, 200], "high"), int)


@pytest.mark.parametrize("conf, args, match", [
    (ProtocolConf(tune=["optim.lr"], tune_seeds=[1], confirm_seeds=[1, 2]), ["optim.lr=1e-3,1e-2"], "a seed has one role"),
    (ProtocolConf(tune=["optim.lr"], tune_seeds=[], confirm_seeds=[1]), ["optim.lr=1e-3,1e-2"], "tune_seeds=.*non-empty"),
    (ProtocolConf(tune=["optim.wd"], tune_seeds=[0], confirm_seeds=[1]), ["optim.lr=1e-3,1e-2"], "does not sweep"),
    (ProtocolConf(tune=["optim.lr"], tune_seeds=[0], confirm_seeds=[1]), ["optim.lr=1e-3"], "at least 2 positive"),
    (CONF, ["optim.lr=1e-3,1e-2", "seed=0,1"], "drop seed from the sweep"),
    (CONF, ["optim.lr=tag(log,interval(1e-4,1e-2))"], "runs a grid"),
])
def test_bad_protocols_are_one_line_errors(conf, args, match):
    with pytest.raises(ConfigError, match=match):
        protocol.check(conf, parse_sweep(args), asha=False)


def test_round_space_records_each_key_on_the_scale_of_the_whole_grid():
    base = parse_sweep(["arm=baseline,small", "optim.lr=1e-3,3e-3,1e-2"])
    space = protocol.round_space(base, [{"arm": "small", "optim.lr": 3e-3, "seed": 1}])
    assert space.grid() == [{"arm": "small", "optim.lr": 3e-3, "seed": 1}]
    assert space.grid_distributions()["optim.lr"].log  # 1e-3..1e-2, as round 1 recorded it
    assert space.overrides_for({"arm": "small", "optim.lr": 3e-3, "seed": 1}) == ["arm=small", "optim.lr=0.003", "seed=1"]


PROTOCOL = ["arm=baseline,small", "optim.lr=1e-3,1e-2", "hydra.sweeper.protocol.tune=[optim.lr]",
            "hydra.sweeper.protocol.tune_seeds=[100]", "hydra.sweeper.protocol.confirm_seeds=[1,2]",
            "hydra.sweeper.protocol.max_extensions=1", "name=sc"]


def _results(sweep_dir):
    return {p.parent.name: p.stat().st_mtime_ns for p in sweep_dir.glob("trials/*/result.json")}


@pytest.mark.slow
def test_select_then_confirm_sweep_records_roles_and_choices_and_a_rerun_trains_nothing(tmp_path, data_cache):
    proc = sweep(tmp_path, data_cache, *PROTOCOL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = tmp_path / "sweeps" / "sc"
    record = json.loads((sweep_dir / "protocol.json").read_text())
    df = schema.analysis_names(pd.read_parquet(sweep_dir / "results.parquet"))  # lr: config/optim.lr
    assert set(df["state"]) == {"COMPLETE"} and df["identity"].is_unique
    tune, confirm = df[df["role"] == "tune"], df[df["role"] == "confirm"]
    assert set(tune["config/seed"]) == {100} and set(confirm["config/seed"]) == {1, 2}
    assert len(tune) + len(confirm) == len(df)
    for choice in record["choices"]:
        arm, lr = choice["setting"]["arm"], choice["chosen"]["optim.lr"]
        mine = tune[tune["config/arm"] == arm]
        # The choice is the tuning seed's lowest loss among the values tried, extensions included.
        assert lr == mine.loc[mine["final_val_loss"].idxmin(), "lr"]
        assert sorted(mine["lr"]) == choice["tried"]["optim.lr"]
        if choice["extensions"]:  # the first choice sat at an edge: one value past it was run
            assert len(choice["tried"]["optim.lr"]) == 3
        assert sorted(confirm[confirm["config/arm"] == arm]["lr"]) == [lr, lr]
    trials = study_trials(sweep_dir, "sc")
    assert {t.user_attrs["role"] for t in trials} == {"tune", "confirm"}
    assert optuna.load_study(study_name="sc", storage=f"sqlite:///{sweep_dir / 'optuna.db'}").user_attrs["protocol"] == record

    before = _results(sweep_dir)
    again = sweep(tmp_path, data_cache, *PROTOCOL)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _results(sweep_dir) == before and "stage 2 (confirm)" in again.stdout and "(4 already done)" in again.stdout


def _kill_when(tmp_path, data_cache, n_results: int, sweep_dir) -> None:
    """Start the sweep in its own process group and kill -9 all of it once n results exist."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), "SMALLINIT_CACHE": str(data_cache), "WANDB_API_KEY": ""}
    args = [sys.executable, str(REPO / "sweep.py"), "-m", *[t for t in TINY if not t.startswith("wandb.")],
            "wandb.mode=disabled", "ray.num_cpus=2", *PROTOCOL]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 400
    while len(_results(sweep_dir)) < n_results and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("n_results", [2, 7], ids=["inside-stage-1", "inside-stage-2"])
def test_kill_9_inside_a_stage_then_rerun_trains_nothing_twice(tmp_path, data_cache, n_results):
    sweep_dir = tmp_path / "sweeps" / "sc"
    _kill_when(tmp_path, data_cache, n_results, sweep_dir)
    done = _results(sweep_dir)
    assert len(done) >= n_results
    proc = sweep(tmp_path, data_cache, *PROTOCOL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = _results(sweep_dir)
    assert {k: after[k] for k in done} == done  # no finished trial trained again
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert set(df["state"]) == {"COMPLETE"} and (df["role"] == "confirm").sum() == 4
    placements = [json.loads(p.read_text()) for p in sweep_dir.glob("trials/*/placement.json")]
    assert all(len(p) <= 2 for p in placements)  # at most the killed attempt and its resume


def test_a_folder_grown_by_another_command_keeps_the_choices_it_had():
    a = protocol.Choice({"arm": "baseline"}, {"optim.lr": [1e-3, 1e-2]}, [], {"optim.lr": 1e-3}, [], 0)
    b = protocol.Choice({"arm": "gamma_only"}, {"optim.lr": [1e-3, 1e-2]}, [], {"optim.lr": 1e-2}, [], 0)
    first = protocol.record(CONF, [a])
    grown = protocol.record(ProtocolConf(tune=["optim.lr"], tune_seeds=[100], confirm_seeds=[1, 2, 3]), [b], first)
    assert [c["setting"]["arm"] for c in grown["choices"]] == ["baseline", "gamma_only"]
    assert grown["confirm_seeds"] == [1, 2, 3]
    protocol.check_record(CONF, first)  # the same protocol: fine
    with pytest.raises(ConfigError, match="tune_seeds=.*chose with tune_seeds=\\[100\\]"):
        protocol.check_record(ProtocolConf(tune=["optim.lr"], tune_seeds=[5], confirm_seeds=[1]), first)


@pytest.mark.slow
def test_show_prints_both_stages_and_a_plain_grid_shows_too(tmp_path, data_cache):
    from .conftest import run_cli

    env = {"SMALLINIT_CACHE": str(data_cache)}
    proc = run_cli(["--show", "-m", "model=nano", *PROTOCOL[:5]], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "# stage 1 (tune): 2 setting(s) x optim.lr=0.001,0.01 x seed in [100] = 4 trials" in proc.stdout
    assert "(up to 2 a side: at most 12 trials)" in proc.stdout
    assert "# stage 2 (confirm): 2 setting(s) at the value(s) stage 1 chooses x seed in [1, 2] = 4 trials" in proc.stdout
    assert proc.stdout.count("seed=100") == 4 and not (tmp_path / "sweeps").exists()
    plain = run_cli(["--show", "-m", "model=nano", "init.gamma=0.5,1.0"], cwd=tmp_path, env=env)
    assert plain.returncode == 0 and "init.gamma=1.0" in plain.stdout, plain.stderr[-2000:]


@pytest.mark.parametrize("content, says", [
    ("[]", "holds a list, not the protocol's record"),
    ('{"choices": [{"chosen": {"optim.lr": 0.001}}]}', "'choices' is not a list of choices, each with its 'setting'"),
    ('{"choices": {}}', "'choices' is not a list of choices"),
])
def test_an_edited_protocol_record_is_one_line_before_any_trial(tmp_path, content, says):
    from smallinit.sweeper.driver import _read_record

    (tmp_path / "protocol.json").write_text(content)
    with pytest.raises(ConfigError, match=rf"protocol.json is unreadable \({re.escape(says)}"):
        _read_record(tmp_path)


@pytest.mark.parametrize("content, says", [
    ('{"fixed": {"model": 5}}', "a 'fixed' value is not an override string"),
    ('{"fixed": {}, "swept": "init.gamma"}', "'swept' is not a list of keys"),
])
def test_an_edited_fixed_overrides_record_is_one_line(tmp_path, content, says):
    from smallinit.sweeper.config.fixed_overrides import _read_record

    (tmp_path / "fixed_overrides.json").write_text(content)
    with pytest.raises(ConfigError, match=rf"fixed_overrides.json is unreadable \({re.escape(says)}"):
        _read_record(tmp_path / "fixed_overrides.json")
