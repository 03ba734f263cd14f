"""The report over several token budgets (experiments/claims/budgets.py): a synthetic results table
with known answers through the section and claim functions, and a real tiny select-then-confirm
sweep with train.budgets over two widths and two arms through the whole report.

The synthetic recipe is the baseline's own L(N, D) at twice its non-embedding N, so N_eff/N is 2
at every cell; its gap to the baseline, A N^-α (2^-α − 1), is negative and shrinks in size as N
grows and does not depend on D: the advantage falls with width and is flat in tokens.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from smallinit.core import results_schema as schema
from smallinit.core.trial_dir import RESULT_KEYS
from smallinit.experiments.claims import budgets
from smallinit.experiments.data.load import LOSS, load_report
from smallinit.experiments.fits.effective_size import non_embedding_params
from smallinit.experiments.output.figures import Figures
from smallinit.experiments.output.render import to_html, to_markdown
from smallinit.experiments.report import sections as S
from smallinit.experiments.report.context import Context
from smallinit.model import AttnConfig, ModelConfig
from smallinit.model.config import llama_d_ff

from .conftest import REPO, TINY, run_cli

WIDTHS, LAYERS, HEAD, VOCAB, SEQ = (128, 192, 256, 384), 4, 64, 4096, 128
BUDGETS = (327680, 1048576, 3145728)
E, A, ALPHA, B, BETA = 1.8, 189.0, 0.35, 94.6, 0.3
ARMS = {"baseline": dict(gamma=0.5, eps=1e-5, gate="none"), "recipe": dict(gamma=1.0, eps=1e-12, gate="elementwise")}


def law(n, d, alpha=ALPHA):
    return E + A * n**-alpha + B * d**-BETA


def budget_sweep(root: Path, budget_list=BUDGETS, seeds: int = 4, noise: float = 0.003, alpha: float = ALPHA) -> Path:
    """A results table of one row per (trial, budget) with trial folders holding trial.json; a
    seed's luck is shared by both arms at a width (paired), as a shared init seed and data order give."""
    rng, rows, d = np.random.default_rng(3), [], root / "synth_budgets"
    for width in WIDTHS:
        luck = rng.normal(0, noise, seeds)
        for arm, setting in ARMS.items():
            cfg = ModelConfig(d_model=width, n_layers=LAYERS, n_heads=width // HEAD, d_ff=llama_d_ff(width),
                              vocab_size=VOCAB, attn=AttnConfig(gate=setting["gate"]))
            n = cfg.num_params()
            ne = non_embedding_params(n, width, VOCAB)
            for s in range(seeds):
                ident = f"{arm}{width}s{s}"
                folder = d / "trials" / ident
                folder.mkdir(parents=True)
                (folder / "trial.json").write_text(json.dumps({"identity": ident, "config": {
                    "model": {"vocab_size": VOCAB, "tie_embeddings": False}, "train": {"seq_len": SEQ}}}))
                for budget in budget_list:
                    loss = law(2 * ne if arm == "recipe" else ne, budget, alpha) + luck[s] + rng.normal(0, noise / 4)
                    if budget == max(budget_list):  # a finished trial's record: the report holds each row to it
                        (folder / "result.json").write_text(json.dumps(dict.fromkeys(RESULT_KEYS, 0.0) | {
                            "identity": ident, "steps": 1, "tokens": budget, "n_params": n, "final_val_loss": loss}))
                    rows.append(dict(identity=f"{ident}@{budget}", trial_identity=ident, state="COMPLETE", model="micro",
                                     n_params=n, d_model=width, n_layers=LAYERS, init_seed=s, train_seed=s, norm="rmsnorm",
                                     ffn="dense", task="lm", lr=3e-3, tokens=budget, budget_tokens=budget,
                                     final_val_loss=loss, unigram_entropy=7.0, trial_dir=f"trials/{ident}", **setting))
    pd.DataFrame(rows).to_parquet(d / "results.parquet")
    return d


def context(sweep_dir: Path, out: Path, n_boot: int = 20) -> Context:
    out.mkdir(parents=True, exist_ok=True)
    sweep, budget_sweep = load_report([sweep_dir])
    return Context(sweep, Figures(out), LOSS, 0.5, None, None, (64, 128), (0.5, 1.0), n_boot, lambda _: None, budget_sweep)


def test_a_recipe_at_twice_n_is_worth_twice_n_with_the_trend_claims_from_the_surface(tmp_path):
    ctx = context(budget_sweep(tmp_path), tmp_path / "out")
    bf = ctx.budgets
    assert bf is not None and bf.baseline == "γ=0.5 | eps=1e-5, gate=none" and bf.recipe.startswith("γ=1 | eps=1e-12")
    assert bf.shape == {"vocab_size": VOCAB, "tie_embeddings": False, "seq_len": SEQ}
    es = bf.es
    assert es.status == "fit" and es.baseline_cells == 12 and len(es.cells) == 12
    assert (es.fit.alpha, es.fit.beta) == pytest.approx((ALPHA, BETA), rel=0.25)
    for cell in es.cells:
        assert cell.n_eff_ratio == pytest.approx(2.0, rel=0.15)
        assert cell.n_eff_ratio_ci[0] < 2.0 * 1.15 and cell.n_eff_ratio_ci[1] > 2.0 / 1.15
        assert 1.0 < cell.compute_multiplier < cell.n_eff_ratio  # the head's FLOPs do not double with N

    claim = budgets.effective_size_claim(bf)
    assert claim.verdict == "supported" and "N_eff/N at d=384, D=3,145,728 = " in claim.reason
    assert len(claim.numbers) == 12 and all(n["n_eff_ratio_ci"][0] > 1 for n in claim.numbers)
    width, tokens = budgets.trend_claims(bf)
    # The gap A N^-α (2^-α − 1) shrinks toward 0 as N grows: the advantage falls with width.
    assert width.verdict == "contradicted" and width.numbers[0]["lo"] > 0
    # One comparison per claim: p against it below 0.025 exactly when the interval excludes 0.
    assert width.numbers[0]["p_holm"] == width.numbers[0]["p_against"] < 0.025 < tokens.numbers[0]["p_holm"]
    true_slope = (law(2 * 7e6, 1e6) - law(7e6, 1e6) - law(2 * 8e5, 1e6) + law(8e5, 1e6)) / math.log(7e6 / 8e5) * 2
    assert width.numbers[0]["slope"] == pytest.approx(true_slope, rel=0.5)
    # Flat in D: the slope's interval holds 0, and the claim says what it excludes.
    assert tokens.verdict == "inconclusive" and tokens.numbers[0]["lo"] < 0 < tokens.numbers[0]["hi"]
    assert "nats per e-fold of tokens, 95% interval [" in tokens.reason and tokens.excluded < 0.01
    assert [c.claim for c in ctx.claims].count("The recipe's advantage grows with width") == 1

    blocks, part = S.effective_size(ctx)
    summary = json.loads(json.dumps(part, allow_nan=False))
    assert set(summary) == {"effective_size", "crossover"}
    cells = summary["effective_size"]["cells"]
    assert len(cells) == 12 and all(c["n_eff_ratio"] > 1.7 and None not in c["compute_multiplier_ci"] for c in cells)
    assert summary["effective_size"]["fit"]["beta"] > 0 and summary["effective_size"]["vocab_size"] == VOCAB
    assert [c["budget_tokens"] for c in summary["crossover"]["d_star"]] == [float(b) for b in BUDGETS]
    assert summary["crossover"]["pays_at_preset"]["d_model"] == 640
    assert {f.file for f in ctx.figs.items} == {"loss_vs_compute.png", "gap_map.png"}
    html = to_html(blocks, "t", ctx.figs.out_dir)
    assert html.count("data:image/png;base64,") == 2 and "N_eff/N 95% interval" in html
    md = to_markdown(blocks)
    assert "| 384 | 3,145,728 |" in md and "Fit: E = " in md



def test_an_effective_size_below_1_at_one_cell_is_contradicted_only_if_it_survives_holm(tmp_path):
    bf = context(budget_sweep(tmp_path), tmp_path / "out").budgets
    cells = bf.es.cells
    for c in cells:  # inside the spread everywhere ...
        c.n_eff_ratio, c.n_eff_ratio_ci, c.p_not_smaller = 1.1, (0.8, 1.3), 0.6
    cells[0].n_eff_ratio, cells[0].n_eff_ratio_ci, cells[0].p_not_smaller = 0.5, (0.3, 0.9), 0.01  # ... but one
    claim = budgets.effective_size_claim(bf)
    assert claim.verdict == "inconclusive" and "below 1 beyond the seed spread at 1 of 12 cells, none after Holm" in claim.reason
    assert claim.numbers[0]["p_holm"] == pytest.approx(0.12) and claim.excluded is None  # 12 x 0.01
    cells[0].p_not_smaller = 0.001
    claim = budgets.effective_size_claim(bf)
    assert claim.verdict == "contradicted" and "bootstrap p against 0.001, Holm-adjusted 0.012" in claim.reason

def test_degenerate_only_where_the_fit_says_which(tmp_path):
    """A baseline whose loss rises with N (α < 0): the verdict is inconclusive, reason "degenerate: alpha"."""
    ctx = context(budget_sweep(tmp_path, alpha=-0.05, seeds=2), tmp_path / "out", n_boot=0)
    claim = budgets.effective_size_claim(ctx.budgets)
    assert ctx.budgets.es.status == "degenerate"
    assert claim.verdict == "inconclusive" and claim.reason.startswith("degenerate: alpha = -")


def test_one_budget_keeps_the_one_budget_fit(tmp_path):
    ctx = context(budget_sweep(tmp_path, budget_list=(327680,), seeds=2), tmp_path / "out", n_boot=10)
    assert ctx.budgets is None
    blocks, part = S.effective_size(ctx)
    assert blocks[0].content == "Effective model size" and "crossover" not in part
    assert part["effective_size"]["fit"] is not None and "gains" in part["effective_size"]


# --- a real sweep ----------------------------------------------------------------------------------

SWEEP = [t for t in TINY if not t.startswith(("wandb.", "train.max_tokens", "train.ckpt_every"))] + [
    "wandb.mode=disabled", "ray.num_cpus=2", "model.d_model=64,128", "model.head_dim=32", "arm=baseline,small",
    "optim.lr=3e-3,1e-2", "optim.schedule=wsd", "train.budgets=[512,1024,2048]", "train.cooldown_frac=0.25",
    "hydra.sweeper.protocol.tune=[optim.lr]", "hydra.sweeper.protocol.tune_seeds=[100]",
    "hydra.sweeper.protocol.confirm_seeds=[1,2]", "hydra.sweeper.protocol.max_extensions=0", "name=eb"]


@pytest.fixture(scope="module")
def budgets_report(tmp_path_factory, data_cache) -> tuple[Path, Path, Path]:
    """16 nano trials of 16 steps (about 5 min with the report on 2 busy cores) and the report
    built in process: (the folder the command ran in, the sweep folder, the report folder)."""
    from smallinit.experiments.report.report import build

    where = tmp_path_factory.mktemp("budgets")
    proc = run_cli(["-m", *SWEEP], cwd=where, env={"SMALLINIT_CACHE": str(data_cache), "WANDB_API_KEY": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = where / "sweeps" / "eb"
    return where, sweep_dir, build([sweep_dir], where / "reports", widths=(64, 128), n_boot=20, log=lambda _: None)


@pytest.mark.slow
def test_a_budgets_sweep_under_select_then_confirm_reports_the_fit_and_a_rerun_command(budgets_report, data_cache):
    """The fit, the crossover and the claims read the confirm rows; the lead's command checked with --show."""
    tmp_path, sweep_dir, out = budgets_report
    s = json.loads((out / "summary.json").read_text())

    # Compared on confirm rows only, every budget of both arms (each budget keeps its trial's lr).
    res = schema.analysis_names(pd.read_parquet(sweep_dir / "results.parquet"))
    confirm = res[res["role"] == "confirm"]
    es = s["effective_size"]
    assert es["baseline_cells"] == 6 and len(es["cells"]) == 6 and es["fit"]["E"] is not None
    assert {c["seeds"] for c in es["cells"]} == {2} and es["vocab_size"] == 4096 and es["seq_len"] == 32
    rec = confirm[confirm["gamma"] == 1.0].groupby(["d_model", "budget_tokens"])["final_val_loss"].mean()
    for cell in es["cells"]:
        assert cell["loss"] == pytest.approx(rec[(cell["d_model"], cell["budget_tokens"])], abs=1e-9)
    ratios = [c["n_eff_ratio"] for c in es["cells"]]  # None where the fit leaves it unbounded
    assert any(r is not None for r in ratios) and all(r > 0 for r in ratios if r is not None)
    assert s["crossover"]["seeds"] == ["1/1", "2/2"] and len(s["crossover"]["budget_star"]) == 2
    claims = {c["claim"]: c for c in s["claims"]}
    eff = claims["Small init is worth a larger effective model size"]
    assert eff["verdict"] == _effective_size_verdict(eff), eff["reason"]
    for axis in ("width", "tokens"):
        c = claims[f"The recipe's advantage grows with {axis}"]
        (slope,) = c["numbers"]
        assert slope["seeds"] == 2 and slope["lo"] <= slope["slope"] <= slope["hi"]
        # the rule the claim states: the gap's slope interval below 0 supports, above 0 contradicts
        expected = "supported" if slope["hi"] < 0 else "contradicted" if slope["lo"] > 0 else "inconclusive"
        assert c["verdict"] == expected, c["reason"]
    assert {"loss_vs_compute.png", "gap_map.png"} <= {f["file"] for f in s["figures"]}
    assert "Effective model size over widths and token budgets" in (out / "report.md").read_text()

    # The lead's command grows the confirm seeds; it sweeps no seed, and its tuning stage is the
    # one that ran (every trial of it already done).
    command = s["findings"]["command"]
    args = shlex.split(command)
    assert "'hydra.sweeper.protocol.confirm_seeds=[1,2,3]'" in command and not any(a.startswith("seed=") for a in args)
    assert "optim.lr=0.003,0.01" in args and "hydra.sweeper.protocol.tune_seeds=[100]" in args
    show = run_cli(["--show", *args[2:]], cwd=tmp_path, env={"SMALLINIT_CACHE": str(data_cache)})
    assert show.returncode == 0, show.stderr[-2000:]
    listed = set(re.findall(r"^#   ([0-9a-f]{12})  ", show.stdout, re.M))
    assert len(listed) == 8 and listed <= set(res["trial_identity"])
    assert "seed in [1, 2, 3] = 12 trials" in show.stdout


@pytest.mark.slow
def test_the_budgets_report_renders_every_figure_in_headless_chromium(budgets_report, tmp_path):
    import subprocess
    import sys

    from smallinit.experiments.report.screenshot import find_browser

    if find_browser() is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install -y chromium)")
    out = budgets_report[2]
    proc = subprocess.run([sys.executable, "-m", "smallinit.experiments.report.screenshot", str(out), "--out",
                           str(tmp_path / "page.png")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    n = len(json.loads((out / "summary.json").read_text())["figures"])
    assert f"{n}/{n} figures rendered" in proc.stdout


def test_the_other_sections_compare_the_arms_at_the_largest_budget(tmp_path):
    """With train.budgets every section but the L(N, D) fit and the crossover reads each trial's
    largest budget, the whole run, whose trials logged curves, probes and per-token losses; the
    fit reads every budget."""
    ctx = context(budget_sweep(tmp_path), tmp_path / "out")
    assert set(ctx.df["budget_tokens"]) == {max(BUDGETS)} and len(ctx.df) == len(WIDTHS) * 2 * 4
    assert ctx.base_variant.startswith("γ=0.5 | eps=1e-5, gate=none") and ctx.recipe.startswith("γ=1 | eps=1e-12")
    df = ctx.df
    gap = [(df[(df["variant"] == ctx.recipe) & (df["d_model"] == w)]["final_val_loss"].mean()
            - df[(df["variant"] == ctx.base_variant) & (df["d_model"] == w)]["final_val_loss"].mean()) for w in WIDTHS]
    points = ctx.width_trend.points
    assert list(points["d_model"]) == list(WIDTHS)
    assert np.allclose(points["gap"], gap)  # the largest budget's gaps
    assert len(ctx.budgets.base_rows) == len(WIDTHS) * 4 * len(BUDGETS)  # the fit: every budget


def test_the_results_page_shows_the_fit_the_cells_and_the_crossings(tmp_path):
    from records.results_budgets import budgets_lines

    s = context(budget_sweep(tmp_path), tmp_path / "out").budgets.summary()
    text = "\n".join(budgets_lines(s["effective_size"], s["crossover"]))
    assert "over its 12 (width, budget) cells, N = non-embedding parameters" in text
    rows = [line for line in text.splitlines() if line.startswith("| 128 ") or line.startswith("| 384 ")]
    assert len(rows) == 6 and all("| 2 |" in r or "| 1.99 |" in r for r in rows)  # N_eff/N of a recipe at 2 N
    assert text.count("- d*(D=") == len(BUDGETS) and text.count("- D*(d=") == len(WIDTHS)
    assert "- the 0.1b preset: D*(d=640)" in text


def _effective_size_verdict(claim: dict) -> str:
    """The verdict the effective-size claim's own cells imply (claims/budgets.py's rule, read from
    the record): inconclusive when the fit is degenerate; contradicted where a cell's interval lies
    below 1 with a Holm-adjusted p within the one-sided 2.5%; supported when every interval lies
    above 1."""
    if claim["reason"].startswith("degenerate: "):
        return "inconclusive"
    cells = claim["numbers"]
    assert cells and all("p_holm" in c for c in cells)
    ci = [[math.nan if v is None else v for v in c["n_eff_ratio_ci"]] for c in cells]  # None: unbounded/none
    if any(hi < 1 and c["p_holm"] <= 0.025 for (_, hi), c in zip(ci, cells)):
        return "contradicted"
    return "supported" if all(lo > 1 for lo, _ in ci) else "inconclusive"
