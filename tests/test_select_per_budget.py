"""Select, then confirm per budget (hydra.sweeper.protocol.per_budget): each budget of
train.budgets chooses its own lr from its cooldown branch on the tuning seeds, an edge that any
budget chooses is extended, and the confirm seeds run every lr some budget chose, once."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from smallinit.core import results_schema as schema
from smallinit.core.errors import ConfigError
from smallinit.sweeper.config import protocol
from smallinit.sweeper.config.config import ProtocolConf
from smallinit.sweeper.config.space import parse_sweep

from .conftest import sweep

CONF = ProtocolConf(tune=["optim.lr"], tune_seeds=[100], confirm_seeds=[1, 2], per_budget=True)
BUDGETS = (1000, 2000, 4000)


def branches(best: dict[int, float]):
    """Per budget a loss lowest at that budget's best lr (quadratic in log lr)."""
    return lambda p: {b: 3.0 + (math.log2(p["optim.lr"]) - math.log2(lr)) ** 2 for b, lr in best.items()}


def run_rounds(conf, grid, outcome):
    """Settle as the driver does: every pending point 'trains', then settle again."""
    ran, seen = [], set()

    def seen_only(p):
        return outcome(p) if p["optim.lr"] in seen else protocol.PENDING

    while True:
        todo, choice = protocol.settle(conf, {"arm": "a"}, grid, seen_only)
        if choice is not None:
            return ran, choice
        ran.append(sorted({p["optim.lr"] for p in todo}))
        seen.update(p["optim.lr"] for p in todo)


def test_each_budget_chooses_its_own_lr_and_confirm_runs_each_chosen_lr_once():
    ran, choice = run_rounds(CONF, {"optim.lr": [2e-3, 4e-3, 8e-3, 16e-3]},
                             branches({1000: 8e-3, 2000: 8e-3, 4000: 4e-3}))
    assert ran == [[2e-3, 4e-3, 8e-3, 16e-3]] and choice.extensions == 0
    assert choice.by_budget == {1000: {"optim.lr": 8e-3}, 2000: {"optim.lr": 8e-3}, 4000: {"optim.lr": 4e-3}}
    assert choice.chosen == {"optim.lr": 4e-3}  # the largest budget's, for readers of one choice
    points = protocol.confirm_points(CONF, [choice])
    assert points == [{"arm": "a", "optim.lr": 8e-3, "seed": 1}, {"arm": "a", "optim.lr": 8e-3, "seed": 2},
                      {"arm": "a", "optim.lr": 4e-3, "seed": 1}, {"arm": "a", "optim.lr": 4e-3, "seed": 2}]
    record = choice.to_dict()
    assert [c["budget_tokens"] for c in record["chosen_by_budget"]] == list(BUDGETS)
    assert len(record["tune_means_by_budget"]) == 3 * 4


def test_with_confirm_to_chosen_each_confirm_run_ends_at_the_largest_budget_that_chose_its_lr():
    _, choice = run_rounds(CONF, {"optim.lr": [2e-3, 4e-3, 8e-3, 16e-3]}, branches({1000: 8e-3, 2000: 8e-3, 4000: 4e-3}))
    conf = ProtocolConf(tune=["optim.lr"], tune_seeds=[100], confirm_seeds=[1], per_budget=True, confirm_to_chosen=True)
    assert protocol.confirm_points(conf, [choice]) == [
        {"arm": "a", "optim.lr": 8e-3, "train.stop_after": 2000, "seed": 1},
        {"arm": "a", "optim.lr": 4e-3, "train.stop_after": 4000, "seed": 1}]  # the largest: the whole plan
    assert protocol.record(conf, [choice])["confirm_to_chosen"] is True
    assert "each to the largest budget that chose it" in protocol.describe_plan(conf, parse_sweep(["optim.lr=1e-3,2e-3"]))[1]
    # A folder's confirm runs were planned one way: another command keeps it; records from before the key ran them whole.
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.protocol.confirm_to_chosen=False is invalid for this folder"):
        protocol.check_record(CONF, protocol.record(conf, [choice]))
    protocol.check_record(CONF, {k: v for k, v in protocol.record(CONF, []).items() if k != "confirm_to_chosen"})
    space = parse_sweep(["optim.lr=1e-3,2e-3"])
    no_budgets = ProtocolConf(tune=["optim.lr"], tune_seeds=[100], confirm_seeds=[1], confirm_to_chosen=True)
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.protocol.confirm_to_chosen=true is invalid without "
                                          r"hydra.sweeper.protocol.per_budget=true"):
        protocol.check(no_budgets, space, asha=False)
    with pytest.raises(ConfigError, match=r"^train.stop_after=512,1024 is invalid with hydra.sweeper.protocol.confirm_to_chosen"):
        protocol.check(conf, parse_sweep(["optim.lr=1e-3,2e-3", "train.stop_after=512,1024"]), asha=False)


def test_an_edge_any_budget_chooses_is_extended_on_both_sides():
    # The smallest budget wants 32e-3 (above the grid), the largest 1e-3 (below it).
    ran, choice = run_rounds(CONF, {"optim.lr": [2e-3, 4e-3, 8e-3, 16e-3]},
                             branches({1000: 32e-3, 2000: 8e-3, 4000: 1e-3}))
    # One step past each edge in the same round, until both choices are inside.
    assert ran[1:] == [[1e-3, 32e-3], [5e-4, 64e-3]]
    assert choice.by_budget[1000] == {"optim.lr": 32e-3} and choice.by_budget[4000] == {"optim.lr": 1e-3}
    assert choice.at_edge == [] and choice.extensions == 4
    # Past the limit the budget's choice stays at the edge, and the record says so.
    _, stuck = run_rounds(CONF, {"optim.lr": [2e-3, 4e-3]}, branches({1000: 1.0, 2000: 3e-3}))
    assert stuck.at_edge == ["optim.lr"] and stuck.by_budget[1000] == {"optim.lr": 16e-3}


def test_a_budget_whose_branch_is_missing_on_a_value_chooses_among_the_rest():
    def outcome(p):
        out = branches({1000: 4e-3, 2000: 4e-3})(p)
        if p["optim.lr"] == 4e-3:
            out[1000] = None  # its 1000-token branch file was damaged
        return out

    conf = ProtocolConf(tune=["optim.lr"], tune_seeds=[100], confirm_seeds=[1], per_budget=True, max_extensions=0)
    _, choice = run_rounds(conf, {"optim.lr": [2e-3, 4e-3, 8e-3]}, outcome)
    assert choice.by_budget[2000] == {"optim.lr": 4e-3} and choice.by_budget[1000]["optim.lr"] != 4e-3


def test_a_folder_chosen_per_budget_refuses_a_command_without_it():
    record = protocol.record(CONF, [])
    assert record["per_budget"] is True
    plain = ProtocolConf(tune=["optim.lr"], tune_seeds=[100], confirm_seeds=[1, 2])
    with pytest.raises(ConfigError, match="per_budget=False is invalid for this folder"):
        protocol.check_record(plain, record)
    old = {k: v for k, v in protocol.record(plain, []).items() if k != "per_budget"}  # a record from before the key
    protocol.check_record(plain, old)


PER_BUDGET = ["arm=baseline,small", "optim.lr=1e-3,1e-2", "optim.schedule=wsd", "train.max_tokens=null",
              "train.budgets=[512,1024]", "train.cooldown_frac=0.25", "hydra.sweeper.protocol.tune=[optim.lr]",
              "hydra.sweeper.protocol.tune_seeds=[100]", "hydra.sweeper.protocol.confirm_seeds=[1,2]",
              "hydra.sweeper.protocol.max_extensions=0", "hydra.sweeper.protocol.per_budget=true",
              "wandb.mode=disabled", "name=pb"]


@pytest.mark.slow
def test_a_per_budget_sweep_chooses_from_the_branches_and_confirms_each_choice(tmp_path, data_cache):
    proc = sweep(tmp_path, data_cache, *PER_BUDGET)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = tmp_path / "sweeps" / "pb"
    record = json.loads((sweep_dir / "protocol.json").read_text())
    df = schema.analysis_names(pd.read_parquet(sweep_dir / "results.parquet"))  # lr: config/optim.lr
    tune, confirm = df[df["role"] == "tune"], df[df["role"] == "confirm"]
    assert record["per_budget"] is True
    for choice in record["choices"]:
        arm = choice["setting"]["arm"]
        mine = tune[tune["config/arm"] == arm]
        chosen = {c["budget_tokens"]: c["chosen"]["optim.lr"] for c in choice["chosen_by_budget"]}
        for tokens, lr in chosen.items():  # each budget's choice is its own branch's lowest loss
            rows = mine[mine["budget_tokens"] == tokens]
            assert lr == rows.loc[rows["final_val_loss"].idxmin(), "lr"]
        confirmed = confirm[(confirm["config/arm"] == arm) & (confirm["budget_tokens"] == 1024)]
        assert sorted(confirmed["lr"]) == sorted([lr for lr in set(chosen.values()) for _ in (1, 2)])
    assert "1,024 tokens: optim.lr=" in proc.stdout

    # The report pairs each budget's arms at that budget's lrs (experiments/fits/token_crossover.py).
    from smallinit.experiments.report.report import build

    out = build([sweep_dir], out_root=tmp_path / "reports", log=lambda *_: None)
    summary = json.loads((out / "summary.json").read_text())["token_crossover"]
    chosen = {c["setting"]["arm"]: {x["budget_tokens"]: x["chosen"]["optim.lr"] for x in c["chosen_by_budget"]}
              for c in record["choices"]}
    assert [g["tokens"] for g in summary["budgets"]] == [512, 1024]
    for g in summary["budgets"]:
        assert g["n"] == 2 and g["lr_baseline"] == chosen["baseline"][g["tokens"]]
        at = confirm[confirm["budget_tokens"] == g["tokens"]]
        rec = at[(at["config/arm"] == "small") & (at["lr"] == chosen["small"][g["tokens"]])]["final_val_loss"].mean()
        base = at[(at["config/arm"] == "baseline") & (at["lr"] == chosen["baseline"][g["tokens"]])]["final_val_loss"].mean()
        assert g["gap"] == pytest.approx(rec - base)
    assert summary["decision"].startswith("no crossover estimate")  # 2 budgets: no line
    assert "Where the gap crosses" in (out / "index.html").read_text()
    # Where it stands, from the trial folders (what `python -m smallinit.experiments.fits.token_crossover --sweep` prints).
    from smallinit.experiments.fits.token_crossover import status

    text = status(sweep_dir)
    assert "## tune: final validation loss" in text and "## confirm: final validation loss" in text
    assert all(f"| {seeds} |" in text for seeds in ("100", "1-2"))
    assert text.count("chose 512: ") == 2 and "Decision so far: no crossover estimate" in text
    from smallinit.core.provenance import cpu_identity

    assert f"## trained on\n\n- {cpu_identity()[0]}" in text  # every branch names its CPU (made_by)
    assert "- confirm (seed, budget) cells whose runs span CPUs or do not name theirs: 0 of 4" in text

    # The summary names the code, packages and machine that built it, and the table it read.
    import hashlib

    prov = json.loads((out / "summary.json").read_text())["provenance"]
    assert len(prov["commit"]) == 40 and prov["packages"]["torch"] and prov["machine"]["cpu_count"] >= 1
    assert prov["results_sha256"]["pb"] == hashlib.sha256((sweep_dir / "results.parquet").read_bytes()).hexdigest()
    # ... and a CSV copy of that table beside it, rows with their identities, named by its sha256
    table = out / prov["results_tables"]["pb"]["file"]
    assert prov["results_tables"]["pb"]["sha256"] == hashlib.sha256(table.read_bytes()).hexdigest()
    copied = pd.read_csv(table)
    assert sorted(copied["identity"]) == sorted(pd.read_parquet(sweep_dir / "results.parquet")["identity"])


@pytest.mark.slow
def test_confirm_runs_to_their_chosen_budget_train_what_the_record_reads_and_no_more(tmp_path, data_cache):
    # lr 3e-3 and 3e-2 on 512 and 8,192 tokens: here the baseline chooses 3e-3 for 512 and 3e-2 for
    # 8,192 (by 0.06 nats on seed 100), so its 3e-3 confirm runs end at 512. Whatever is chosen,
    # every confirm run's rows end at the largest budget that chose its lr, each budget reads one
    # run per seed, and the report pairs the arms per budget.
    args = [a.replace("optim.lr=1e-3,1e-2", "optim.lr=3e-3,3e-2").replace("train.budgets=[512,1024]", "train.budgets=[512,8192]")
            for a in PER_BUDGET]
    proc = sweep(tmp_path, data_cache, *args, "train.eval_every=8", "train.probe_every=0", "train.ckpt_every=8",
                 "hydra.sweeper.protocol.confirm_to_chosen=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = tmp_path / "sweeps" / "pb"
    record = json.loads((sweep_dir / "protocol.json").read_text())
    df = schema.analysis_names(pd.read_parquet(sweep_dir / "results.parquet"))
    confirm = df[df["role"] == "confirm"]
    assert record["confirm_to_chosen"] is True and set(confirm["state"]) == {"COMPLETE"}
    lowest = next(line for line in proc.stdout.splitlines() if line.startswith("lowest single trial"))
    assert "nan" not in lowest  # a tuning trial sets no train.stop_after: not named
    best = next(line for line in proc.stdout.splitlines() if line.startswith("best setting"))
    assert best.startswith("best setting: arm=") and "stop_after" not in best  # where a run ends is not a setting
    chosen = {c["setting"]["arm"]: {x["budget_tokens"]: x["chosen"]["optim.lr"] for x in c["chosen_by_budget"]}
              for c in record["choices"]}
    for arm, by_budget in chosen.items():
        mine = confirm[confirm["config/arm"] == arm]
        for lr, runs in mine.groupby("lr"):
            last = max(b for b, c in by_budget.items() if c == lr)
            assert sorted(runs["budget_tokens"]) == sorted([b for b in (512, 8192) if b <= last] * 2), (arm, lr)
        for tokens, lr in by_budget.items():
            assert sorted(mine[(mine["budget_tokens"] == tokens) & (mine["lr"] == lr)]["train_seed"]) == [1, 2]
    if len(set(chosen["baseline"].values())) == 2:  # as on the machines this was written on
        assert "arm=baseline optim.lr=0.003 train.stop_after=512 seed=1" in proc.stdout

    from smallinit.experiments.report.report import build

    out = build([sweep_dir], out_root=tmp_path / "reports", log=lambda *_: None)
    summary = json.loads((out / "summary.json").read_text())["token_crossover"]
    assert [(g["tokens"], g["n"], g["lr_baseline"]) for g in summary["budgets"]] == [
        (b, 2, chosen["baseline"][b]) for b in (512, 8192)]


def test_per_budget_without_budgets_is_refused_before_anything_is_written(tmp_path, data_cache):
    args = [a for a in PER_BUDGET if not a.startswith(("train.budgets", "train.max_tokens", "train.cooldown"))]
    proc = sweep(tmp_path, data_cache, *args)
    assert proc.returncode != 0 and "per_budget=true is invalid here" in proc.stderr
    assert not (tmp_path / "sweeps" / "pb").exists()


def test_a_budgets_choice_reads_only_a_whole_branch_file_of_this_trial_and_budget(tmp_path):
    """Stage 1 chooses each budget's lr from its branch files: one with no finite loss, another
    budget's, or another trial's gives that budget no value from this run, rather than a wrong one."""
    from types import SimpleNamespace

    from smallinit.core.trial_dir import RESULT_KEYS, TrialDir
    from smallinit.sweeper.driver import _branch_losses

    folder = TrialDir(tmp_path)
    budgets = [1024, 2048, 4096, 8192, 16384]
    spec = SimpleNamespace(out_dir=tmp_path, identity="abc", trial=SimpleNamespace(train=SimpleNamespace(
        budgets_trained=budgets)))

    def branch(tokens, **changes):
        folder.write_budget_result(tokens, dict.fromkeys(RESULT_KEYS, 0.0) | {
            "identity": "abc", "steps": 1, "tokens": tokens, "n_params": 1, "final_val_loss": 5.0,
            "budget_tokens": tokens} | changes)

    branch(1024)
    branch(2048, final_val_loss=float("inf"))
    branch(4096, budget_tokens=8192)
    branch(8192, identity="other")
    assert _branch_losses(spec) == {1024: 5.0, 2048: None, 4096: None, 8192: None, 16384: None}


def test_the_cpu_tally_counts_each_trial_once_even_when_its_branches_name_two():
    """crossover/status.md read '25 trial(s)' on one CPU and '10 unrecorded' for 34 trials: one
    trial's branches were written before and after results named their CPU."""
    import pandas as pd

    from smallinit.experiments.fits.token_crossover import machine_lines

    df = pd.DataFrame({"trial_identity": ["a", "a", "b", "c"], "cpu": ["EPYC", "unrecorded", "EPYC", "unrecorded"],
                       "role": ["tune"] * 4})
    lines = machine_lines(df)
    assert lines[2:5] == ["- EPYC: 1 trial(s)", "- EPYC and unrecorded: 1 trial(s)", "- unrecorded: 1 trial(s)"]
