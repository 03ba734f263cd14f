"""The whole-run lead reader: per budget, each sweep's lead paired by seed, the schedule x arm
interaction, what differs between two sweeps of one schedule, the lead at a shared lr, Holm over
the family, and a sweep without every seed left waiting."""

import numpy as np
import pandas as pd
import pytest

from records.whole_runs import Sweep, check_same, comparisons, judge, markdown
from smallinit.experiments.stats.paired import holm

B = 4194304
SEEDS = list(range(1, 7))


def _sweep(name, schedule, losses: dict[str, float], lrs: dict[str, float], seeds=SEEDS, noise=0.0, rng_seed=0,
           budget=B) -> Sweep:
    rng = np.random.default_rng(rng_seed)
    rows = [{"budget": budget, "train_seed": s, "config/arm": arm, "lr": lrs[arm], "d_model": 128,
             "final_val_loss": loss + noise * rng.normal()} for s in seeds for arm, loss in losses.items()]
    return Sweep(name, schedule, pd.DataFrame(rows))


def _read(sweeps, shared=()):
    rows, waiting = comparisons(list(sweeps), list(shared), SEEDS, "baseline", "small")
    judge(rows)
    return rows, waiting


def test_each_schedules_lead_and_their_difference_are_paired_by_seed():
    wsd = _sweep("xwsd", "WSD", {"baseline": 4.4, "small": 4.32}, {"baseline": 2e-3, "small": 5e-4}, noise=0.01)
    cos = _sweep("xcos", "cosine", {"baseline": 4.5, "small": 4.49}, {"baseline": 4e-3, "small": 2e-3}, noise=0.01, rng_seed=1)
    rows, waiting = _read([wsd, cos])
    assert waiting == [] and [r["comparison"] for r in rows] == ["lead", "lead", "interaction"]
    leads = {r["what"]: r for r in rows if r["comparison"] == "lead"}
    lead_wsd, lead_cos = leads["lead under WSD: small − baseline (xwsd)"], leads["lead under cosine: small − baseline (xcos)"]
    inter = rows[2]
    assert np.allclose(inter["diffs"], np.subtract(lead_wsd["diffs"], lead_cos["diffs"]))
    assert lead_wsd["mean"] == pytest.approx(-0.08, abs=0.02)
    assert [r["p_holm"] for r in rows] == holm([r["p_two"] for r in rows])
    assert lead_wsd["verdict"] == "recipe ahead" and inter["verdict"] == "larger under WSD"
    assert lead_cos["a"]["lrs"] == [2e-3] and lead_cos["b"]["lrs"] == [4e-3]
    assert lead_wsd["a"]["mean"] - lead_wsd["b"]["mean"] == pytest.approx(lead_wsd["mean"])
    assert "lead under WSD" in markdown(rows, waiting, "python -m records.whole_runs xwsd xcos")


def test_two_sweeps_of_one_schedule_are_compared_arm_by_arm():
    branch = _sweep("crossover", "WSD", {"baseline": 4.38, "small": 4.30}, {"baseline": 2e-3, "small": 5e-4})
    whole = _sweep("whole_wsd", "WSD", {"baseline": 4.37, "small": 4.30}, {"baseline": 2e-3, "small": 5e-4}, noise=0.001)
    cos = _sweep("cos", "cosine", {"baseline": 4.42, "small": 4.42}, {"baseline": 4e-3, "small": 2e-3}, noise=0.01)
    rows, _ = _read([branch, whole, cos])
    kinds = [r["comparison"] for r in rows]
    assert kinds.count("lead") == 3 and kinds.count("interaction") == 2 and kinds.count("sweeps_differ") == 2
    differ = {r["what"]: r for r in rows if r["comparison"] == "sweeps_differ"}
    base = differ["baseline under WSD: crossover − whole_wsd"]
    assert base["mean"] == pytest.approx(0.01, abs=0.002) and base["verdict"] == "lower in whole_wsd"


def test_the_shared_lr_lead_pairs_the_recipe_with_the_baseline_that_chose_its_lr():
    cos = _sweep("cos", "cosine", {"baseline": 4.42, "small": 4.42}, {"baseline": 4e-3, "small": 2e-3}, noise=0.01)
    shared = _sweep("shared_cos", "cosine", {"small": 4.47}, {"small": 4e-3}, noise=0.01, rng_seed=3)
    other_lr = _sweep("shared_other", "cosine", {"small": 4.47}, {"small": 8e-3})
    rows, waiting = _read([cos], [shared, other_lr])
    shared_rows = [r for r in rows if r["comparison"] == "lead_shared_lr"]
    assert len(shared_rows) == 1
    r = shared_rows[0]
    assert r["a"]["label"] == "shared_cos" and r["b"]["label"] == "cos" and r["b"]["lrs"] == [4e-3]
    assert r["mean"] == pytest.approx(0.05, abs=0.03) and r["verdict"] == "baseline ahead"
    assert waiting == [f"{B:,} tokens: shared_other (lr [0.008]) has no complete cosine sweep whose baseline chose its lr"]


def test_an_interval_holding_zero_is_inconclusive_with_what_it_excludes():
    wsd = _sweep("w", "WSD", {"baseline": 4.4, "small": 4.4}, {"baseline": 2e-3, "small": 2e-3}, noise=0.05)
    cos = _sweep("c", "cosine", {"baseline": 4.5, "small": 4.5}, {"baseline": 2e-3, "small": 2e-3}, noise=0.05, rng_seed=2)
    rows, _ = _read([wsd, cos])
    for r in rows:
        assert r["lo"] < 0 < r["hi"] and r["verdict"] == "inconclusive"
        assert r["excludes"] == f"below {r['lo']:+.4f} and above {r['hi']:+.4f}"


def test_a_sweep_missing_a_seed_waits_and_budgets_no_cosine_sweep_trained_are_not_asked():
    cos = _sweep("c", "cosine", {"baseline": 4.5, "small": 4.49}, {"baseline": 4e-3, "small": 2e-3}, seeds=range(1, 5))
    wsd_elsewhere = _sweep("w", "WSD", {"baseline": 4.4, "small": 4.3}, {"baseline": 2e-3, "small": 5e-4}, budget=2 * B)
    started = Sweep("c8", "cosine", cos.runs.iloc[:0])
    rows, waiting = _read([cos, wsd_elsewhere, started])
    assert rows == [] and waiting == ["c8: no complete confirm run yet", f"{B:,} tokens: c holds 4 of 6 seeds in both arms"]


def test_sweeps_of_different_models_are_refused_in_one_line():
    a = _sweep("a", "cosine", {"baseline": 4.5, "small": 4.49}, {"baseline": 4e-3, "small": 2e-3})
    b = _sweep("b", "WSD", {"baseline": 4.5, "small": 4.49}, {"baseline": 4e-3, "small": 2e-3})
    b.runs["d_model"] = 256
    with pytest.raises(SystemExit, match=r"^error: the sweeps differ in d_model \(\{'a': \['128'\], 'b': \['256'\]\}\)"):
        check_same([a, b])



def test_a_shared_sweep_without_an_arm_column_is_the_recipe_and_must_match_its_recipe(tmp_path):
    from records.whole_runs import load
    cos = _sweep("cos", "cosine", {"baseline": 4.5, "small": 4.49}, {"baseline": 4e-3, "small": 2e-3})
    cos.runs = cos.runs.assign(gamma=cos.runs["config/arm"].map({"baseline": 0.5, "small": 1.0}))

    def shared(gamma: float) -> Sweep:  # a results table as a sweep with `arm=small` fixed writes it: no param.arm
        (tmp_path / "shared").mkdir(exist_ok=True)
        pd.DataFrame([{"state": "COMPLETE", "tokens": B, "train_seed": s, "lr": 4e-3, "d_model": 128, "gamma": gamma,
                       "final_val_loss": 4.47, "config/optim.schedule": "cosine"} for s in SEEDS]
                     ).to_parquet(tmp_path / "shared" / "results.parquet")
        return load(tmp_path / "shared", arm="small")

    assert set(shared(1.0).runs["config/arm"]) == {"small"}
    check_same([cos, shared(1.0)])
    rows, _ = _read([cos], [shared(1.0)])
    assert [r["comparison"] for r in rows] == ["lead", "lead_shared_lr"]
    with pytest.raises(SystemExit, match=r"^error: arm small differs in gamma across the sweeps"):
        check_same([cos, shared(0.5)])  # the baseline's init is not the recipe at a shared lr


def test_a_sweep_read_while_it_tunes_compares_none_of_its_tuning_runs(tmp_path):
    from records.whole_runs import load
    (tmp_path / "tuning").mkdir()  # stage 1 under way: no protocol.json, every row a tuning run (here on seeds 1-6)
    pd.DataFrame([{"state": "COMPLETE", "tokens": B, "train_seed": s, "lr": lr, "d_model": 128, "config/arm": arm,
                   "final_val_loss": 4.5, "role": "tune", "config/optim.schedule": "cosine"}
                  for s in SEEDS for arm in ("baseline", "small") for lr in (1e-3, 2e-3)]
                 ).to_parquet(tmp_path / "tuning" / "results.parquet")
    tuning = load(tmp_path / "tuning")
    assert tuning.runs.empty
    rows, waiting = _read([tuning])
    assert rows == [] and waiting == ["tuning: no complete confirm run yet"]


def test_a_family_of_leads_and_their_difference_reads_every_budget_of_two_wsd_sweeps():
    """crossover_registry's rule: per budget, the lead in each WSD sweep and lead(a) − lead(b),
    nothing else; budgets no cosine sweep trained are read with every_budget."""
    once = _sweep("once", "WSD", {"baseline": 4.5, "small": 4.45}, {"baseline": 2e-3, "small": 1e-3}, noise=0.01)
    again = _sweep("again", "WSD", {"baseline": 4.4, "small": 4.30}, {"baseline": 2e-3, "small": 1e-3}, noise=0.01,
                   rng_seed=1)
    assert comparisons([once, again], [], SEEDS, "baseline", "small", family=("lead", "leads_differ")) == ([], [])
    rows, waiting = comparisons([once, again], [], SEEDS, "baseline", "small", family=("lead", "leads_differ"),
                                every_budget=True)
    assert [r["comparison"] for r in rows] == ["lead", "lead", "leads_differ"] and waiting == []
    differ = rows[2]
    assert differ["what"] == "lead under WSD in once − lead in again" and differ["words"] == ["larger in once", "larger in again"]
    assert differ["diffs"] == pytest.approx(np.array(rows[0]["diffs"]) - np.array(rows[1]["diffs"]))
    assert differ["mean"] == pytest.approx(0.05, abs=0.02)  # the lead is 0.05 in once, 0.10 in again


def test_sweeps_on_two_corpora_pair_only_in_leads_differ():
    """The whole corpus and a prefix of it (crossover_registry and its repeat): their leads are
    compared; an interaction or an arm's difference across the two corpora is never formed."""
    once = _sweep("once", "WSD", {"baseline": 4.5, "small": 4.45}, {"baseline": 2e-3, "small": 1e-3}, noise=0.01)
    again = _sweep("again", "WSD", {"baseline": 4.4, "small": 4.30}, {"baseline": 2e-3, "small": 1e-3}, rng_seed=1,
                   noise=0.01)
    cosine = _sweep("cos_once", "cosine", {"baseline": 4.6, "small": 4.6}, {"baseline": 4e-3, "small": 2e-3}, noise=0.01,
                    rng_seed=2)
    for s, tokens in ((once, 53_241_418), (again, 2_701_352), (cosine, 53_241_418)):
        s.runs["corpus_tokens"] = tokens
    with pytest.raises(SystemExit, match=r"^error: the sweeps differ in corpus_tokens"):
        check_same([once, again, cosine])  # a rule that compares no leads across corpora pairs one corpus only
    check_same([once, again, cosine], corpora_may_differ=True)  # leads_differ: the corpus may differ, the model not
    rows, _ = comparisons([once, again, cosine], [], SEEDS, "baseline", "small",
                          family=("lead", "leads_differ", "interaction", "sweeps_differ"), every_budget=True)
    kinds = [(r["comparison"], r["a"]["label"], r["b"]["label"]) for r in rows if r["comparison"] != "lead"]
    assert kinds == [("interaction", "once", "cos_once"), ("leads_differ", "once", "again")]


def test_while_any_comparison_waits_no_row_is_a_verdict_and_an_arm_with_no_seeds_is_named(tmp_path):
    """A family read before its last sweep finishes is Holm-adjusted over fewer comparisons than the
    rule fixes (p too small): every row says interim, the page and summary.json say so, and the
    waiting line names the arm that holds none (it read '6 of 6 seeds in both arms' before)."""
    from records.whole_runs import INTERIM
    done = _sweep("done", "cosine", {"baseline": 4.5, "small": 4.3}, {"baseline": 4e-3, "small": 2e-3}, noise=0.01)
    half = _sweep("half", "WSD", {"baseline": 4.4}, {"baseline": 2e-3}, budget=B)  # the recipe's confirm runs not yet run
    rows, waiting = comparisons([done, half], [], SEEDS, "baseline", "small")
    assert waiting == [f"{B:,} tokens: half holds 6 of 6 seeds in baseline and 0 of 6 seeds in small"]
    judge(rows, interim=bool(waiting))
    assert [r["verdict"] for r in rows] == [INTERIM]  # "recipe ahead" on its own
    assert "**Interim**" in markdown(rows, waiting, "python -m records.whole_runs done half")
    judge(rows)
    assert rows[0]["verdict"] == "recipe ahead"


def test_a_shared_sweep_waits_only_where_the_family_reads_it():
    done = _sweep("done", "cosine", {"baseline": 4.5, "small": 4.3}, {"baseline": 4e-3, "small": 2e-3}, noise=0.01)
    empty = Sweep("shared", "cosine", done.runs.iloc[:0])
    assert comparisons([done], [empty], SEEDS, "baseline", "small", family=("lead",))[1] == []
    assert comparisons([done], [empty], SEEDS, "baseline", "small")[1] == ["shared: no complete confirm run yet"]
