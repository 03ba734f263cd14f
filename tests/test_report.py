"""`make report` end to end on a real tiny sweep, plus its statistics on synthetic data with
known answers (power law, paired comparisons, Delta_sym, Optuna importances).

The sweep (8 tiny trials: gamma x eps x train seed) runs once per session through the real CLI;
the report is built through its CLI too, then its numbers are checked against the results
table and the per-token files, and its page is rendered in headless Chromium where available.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from smallinit.core import results_schema as schema
from smallinit.experiments.claims import claims as claims_mod
from smallinit.experiments.data.load import load
from smallinit.experiments.fits.scaling import effective_size, fit_power_law
from smallinit.experiments.output.figures import LabelError, check_labels
from smallinit.experiments.report.report import build
from smallinit.experiments.report.report import main as report_main
from smallinit.experiments.report.screenshot import find_browser
from smallinit.experiments.stats.stats import A_HIGHER, A_LOWER, ONE_SEED, WITHIN, compare, verdict
from smallinit.experiments.stats.tokens import delta_sym

from .conftest import REPO, WIDTHS, report_cli, run_cli, synthetic_sweep


@pytest.fixture(scope="session")
def tiny_report(tiny_sweep, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reports")
    proc = report_cli("--sweep", str(tiny_sweep), "--out", str(out), "--widths", WIDTHS, "--boot", "50")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"report: {out / 'rep' / 'index.html'}" in proc.stdout
    return out / "rep"


@pytest.fixture(scope="session")
def summary(tiny_report) -> dict:
    return json.loads((tiny_report / "summary.json").read_text())


# --- the real sweep ------------------------------------------------------------------------------

def test_a_moved_sweep_folder_reports_in_full(tiny_sweep, tiny_report, tmp_path):
    import shutil

    stored = pd.read_parquet(tiny_sweep / "results.parquet")
    assert not any(str(v).startswith("/") for v in stored["metrics_path"])  # relative to the folder
    moved = tmp_path / "laptop" / "rep"
    shutil.copytree(tiny_sweep, moved)
    proc = report_cli("--sweep", str(moved), "--out", str(tmp_path / "out"), "--widths", WIDTHS, "--boot", "50")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (tmp_path / "out" / "rep" / "report.md").read_text()
    assert len(report.splitlines()) == len((tiny_report / "report.md").read_text().splitlines())
    from smallinit.experiments.data.load import load

    df = load([moved]).results
    assert all(str(p).startswith(str(moved)) and Path(p).exists() for p in df["metrics_path"])


def test_report_writes_every_artifact(tiny_report, summary):
    for name in ("index.html", "report.md", "summary.json"):
        assert (tiny_report / name).stat().st_size > 0
    pngs = {p.name for p in tiny_report.glob("*.png")}
    assert {f["file"] for f in summary["figures"]} == pngs
    assert {"loss_vs_gamma.png", "token_gain.png", "condensation.png", "cosine_heatmaps.png", "attention_sink.png",
            "saturation.png", "residual_balance.png"} <= pngs
    html = (tiny_report / "index.html").read_text()
    assert html.count("data:image/png;base64,") == len(pngs)  # self-contained
    assert "http://" not in html and "https://" not in html  # nothing to fetch
    md = (tiny_report / "report.md").read_text()
    assert all(f"]({p})" in md for p in pngs)


def test_best_gamma_per_arm_is_the_argmin_of_the_results(tiny_sweep, summary):
    df = schema.analysis_names(pd.read_parquet(tiny_sweep / "results.parquet"))
    df = df[df["state"] == "COMPLETE"]
    expected = {}
    for (eps, _gate, _norm), g in df.groupby(["eps", "gate", "norm"]):
        means = g.groupby("gamma")["final_val_loss"].mean()
        expected[f"{eps:.0e}".replace("e-0", "e-")] = (means.idxmin(), means.min())
    got = {row["setting"].split("eps=")[1].split(",")[0]: (row["best_gamma"], row["best_loss"]) for row in summary["best_gamma"]}
    assert got.keys() == expected.keys()
    for k, (gamma, loss) in expected.items():
        assert got[k][0] == pytest.approx(gamma)
        assert got[k][1] == pytest.approx(loss, abs=1e-9)
        row = next(r for r in summary["best_gamma"] if f"eps={k}" in r["setting"])
        assert row["seeds"] == 2 and row["margin"]["paired"] and row["margin"]["n"] == 2


def claim(summary: dict, words: str) -> dict:
    return next(c for c in summary["claims"] if words in c["claim"])


def test_claims_table_has_every_claim_with_a_verdict_and_numbers(summary):
    assert len(summary["claims"]) == 9
    for c in summary["claims"]:
        assert c["verdict"] in claims_mod.VERDICTS, c
        assert c["reason"]
    # Two seeds per arm: the gamma comparisons are paired with an interval; no gamma > 1 was run,
    # so "worse above 1" cannot be supported.
    best = claim(summary, "Best γ")
    assert best["numbers"] and all(n["paired"] and n["n"] == 2 and n["lo"] is not None for n in best["numbers"])
    assert best["verdict"] != "supported"
    assert claim(summary, "gate")["verdict"] == "not run"  # no gated arm in this sweep
    eff = claim(summary, "effective model size")
    assert eff["verdict"] == "not run" and "≥ 3 model sizes" in eff["reason"]
    assert claim(summary, "grows with width")["verdict"] == "not run"  # one width
    assert claim(summary, "update-to-stream")["verdict"] == "supported"  # deterministic, at init
    cond = claim(summary, "condenses")
    trajectories = [n for n in cond["numbers"] if "peak_step" in n]
    assert len(trajectories) == 8  # one trajectory per trial
    rise = [n for n in cond["numbers"] if n.get("what", "").startswith("relative |cos| rise")]
    # γ = 1 against γ = 0.5 at each eps (γ alone differs), paired by seed
    assert [r["what"] for r in rise] == ["relative |cos| rise, γ=1 | eps=1e-12 − γ=0.5 | eps=1e-12",
                                         "relative |cos| rise, γ=1 | eps=1e-5 − γ=0.5 | eps=1e-5"]
    assert all(r["n"] == 2 and r["lo"] <= r["diff"] <= r["hi"] for r in rise)


def test_effective_size_says_what_is_missing_with_one_size(summary):
    es = summary["effective_size"]
    assert es["fit"] is None
    assert "this sweep has 1" in es["status"] and "nano" in es["status"]


def test_token_delta_matches_the_per_token_files(tiny_sweep, summary):
    tok = summary["tokens"]
    assert tok["a"].startswith("γ=1") and tok["b"].startswith("γ=0.5")
    df = schema.analysis_names(pd.read_parquet(tiny_sweep / "results.parquet"))
    a = df[(df["gamma"] == 1.0) & (df["eps"] == 1e-12)].set_index("train_seed")
    b = df[(df["gamma"] == 0.5) & (df["eps"] == 1e-5)].set_index("train_seed")
    per_seed = []
    for seed in (0, 1):
        # Stored relative to the sweep folder.
        za, zb = (np.load(tiny_sweep / t.loc[seed, "per_token_losses_path"]) for t in (a, b))
        assert np.array_equal(za["targets"], zb["targets"])
        pa, pb = np.exp(-za["loss"].astype(float)), np.exp(-zb["loss"].astype(float))
        per_seed.append(((pa - pb) / (pa + pb)).mean())
    res = tok["results"][0]
    assert res["overall"]["diff"] == pytest.approx(np.mean(per_seed), rel=1e-6)
    assert res["overall"]["n"] == 2
    assert sum(b["tokens"] for b in res["buckets"]) == res["n_tokens"] == len(za["targets"])


def test_scale_is_stated(tiny_sweep, summary, tiny_report):
    df = pd.read_parquet(tiny_sweep / "results.parquet")
    assert summary["scale"]["max_params"] == df["n_params"].max()
    assert summary["scale"]["max_tokens"] == df["tokens"].max()
    passes = df["tokens"] / df["corpus_tokens"]  # every trial records its corpus's training tokens
    assert summary["scale"]["max_passes"] == pytest.approx(passes.max()) and passes.notna().all()
    assert "passes over its corpus" in (tiny_report / "index.html").read_text()
    html = (tiny_report / "index.html").read_text()
    assert "CPU-scale measurements, not a reproduction" in html
    assert f"{int(df['n_params'].max()):,}" in html


def test_every_figure_has_a_title_axis_labels_and_units(summary):
    assert summary["figures"]
    for fig in summary["figures"]:
        assert fig["title"].strip(), fig["name"]
        for ax in fig["axes"]:
            assert ax["title"].strip() and ax["xlabel"].strip() and ax["ylabel"].strip(), (fig["name"], ax)
            assert "[" in ax["xlabel"] and "[" in ax["ylabel"], (fig["name"], ax)


def test_residual_balance_follows_the_predicted_exponents(summary):
    slopes = {s["gamma"]: s for s in summary["residual_balance"]["slopes"]}
    assert set(slopes) == {0.5, 0.75, 1.0, 1.25}
    for gamma, s in slopes.items():
        assert s["measured"] == pytest.approx(1 - gamma, abs=0.1)
    assert {r["width"] for r in summary["residual_balance"]["data"]} == {64, 128, 256}


def test_the_page_renders_in_headless_chromium(tiny_report, summary, tmp_path):
    """`python -m smallinit.experiments.report.screenshot` as a person runs it: every figure decodes, the
    screenshot holds the whole page."""
    if find_browser() is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install -y chromium)")
    shot = tmp_path / "page.png"
    proc = subprocess.run([sys.executable, "-m", "smallinit.experiments.report.screenshot", str(tiny_report), "--out", str(shot)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    n = len(summary["figures"])
    assert f"{n}/{n} figures rendered" in proc.stdout
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("L"))
    assert img.shape[1] == 1280 and img.shape[0] > 3000  # the whole page, not one screen
    assert (img < 200).mean() > 0.02  # text and figures, not a blank page


def _expected_lead(tiny_sweep: Path) -> tuple[str, str]:
    """The best setting's line and the best-γ sentence, computed here from results.parquet."""
    from scipy import stats

    df = schema.analysis_names(pd.read_parquet(tiny_sweep / "results.parquet"))
    df = df[df["state"] == "COMPLETE"].assign(eps_label=lambda d: d["eps"].map(lambda e: f"{e:.0e}".replace("e-0", "e-")))
    means = df.groupby(["gamma", "eps_label"])["final_val_loss"].mean().sort_values()
    (g1, e1), (g2, e2) = means.index[:2]
    per_seed = df.set_index(["gamma", "eps_label", "train_seed"])["final_val_loss"]
    d = np.array([per_seed[(g2, e2, s)] - per_seed[(g1, e1, s)] for s in (0, 1)])
    half = stats.t.ppf(0.975, 1) * d.std(ddof=1) / np.sqrt(2)
    line = (f"γ={g1:g} | eps={e1} ({means.iloc[0]:.4f} nats, mean of 2 seeds), {d.mean():.4f} nats (95% interval "
            f"{d.mean() - half:.4f} to {d.mean() + half:.4f}, paired over 2 seeds")
    best_per_eps = {e: means.xs(e, level="eps_label").idxmin() for e in ("1e-5", "1e-12")}
    if len(set(best_per_eps.values())) == 1:
        return line, f"γ = {best_per_eps['1e-5']:g} has the lowest loss in all 2 arms (eps="
    return line, "The best γ differs between arms: γ = "


def test_the_first_screen_says_what_the_sweep_found_then_the_claims(tiny_sweep, tiny_report, summary):
    """Rendered in headless Chromium at 1280x800: before any scrolling the reader sees the best
    setting with its paired margin, what was not run with its command, and the claims."""
    if find_browser() is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install -y chromium)")
    from smallinit.experiments.report.screenshot import first_screen

    line, gamma_sentence = _expected_lead(tiny_sweep)
    top = first_screen(tiny_report / "index.html", 1280, 800)
    assert "Lowest final validation loss at nano (d=" in top and line in top, top[:800]
    arms = top[top.index(gamma_sentence):].split(".")[0]
    assert "eps=1e-5" in arms and "eps=1e-12" in arms
    assert "Not run: more than 2 seeds per setting, and with 2 a 95% interval spans ±12.7 standard errors" in top
    command = summary["findings"]["command"]
    assert command in top and "The paper's claims, as this data supports them" in top
    assert top.index(line) < top.index("The paper's claims, as this data supports them")
    # The command is the sweep's own, grown to 3 seeds: every trial already run is among its
    # trials (so a rerun skips them), and 4 more are new.
    import shlex

    args = shlex.split(command)
    assert args[:3] == ["python", "sweep.py", "-m"] and "train.seed=0,1,2" in args and "name=rep" in args
    proc = run_cli(["--show", *args[2:]], cwd=tiny_sweep.parent.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = re.findall(r"^#   ([0-9a-f]{12})  ", proc.stdout, re.M)
    done = set(pd.read_parquet(tiny_sweep / "results.parquet")["identity"])
    assert len(listed) == 12 and done <= set(listed)


def test_sections_that_do_not_apply_to_a_grid_are_left_out(tiny_sweep, tiny_report, summary):
    md = (tiny_report / "report.md").read_text()
    assert "Optuna parameter importances" not in md and summary["importances"] == {"values": {}, "notes": []}
    assert "No learning-rate axis: every comparison is at one optimiser setting (lr = 0.003;" in md  # one lr: true


def test_one_seed_says_what_seeds_would_add(tmp_path):
    d = synthetic_sweep(tmp_path, gain=0.2, seeds=1)
    out = build([d], tmp_path / "reports", widths=(64, 128), n_boot=20, log=lambda _: None)
    s = json.loads((out / "summary.json").read_text())
    sentences = s["findings"]["sentences"]
    assert sentences[0].startswith("Lowest final validation loss per size: m0 (")
    assert "one seed: no interval" in sentences[0]
    # No record of the sweep's command (a table without its folder's files): the override to add.
    assert ("Not run: more than one seed per setting, so no difference has an interval. Rerun the sweep's command "
            "with seed=0,1,2 to add them.") in sentences
    assert s["findings"]["command"] is None and sentences[-1].startswith("The paper's claims, below: ")


# --- errors --------------------------------------------------------------------------------------

def test_errors_are_one_line(tmp_path, capsys):
    def run(*args: str) -> tuple[int, str]:
        rc = report_main(list(args))
        return rc, capsys.readouterr().err

    rc, err = run("--sweep", str(tmp_path / "nope"))
    assert rc == 2 and err.startswith("error: sweep folder") and err.strip().count("\n") == 0
    rc, err = run("--sweeps-root", str(tmp_path))
    assert rc == 2 and "no sweep found" in err and err.strip().count("\n") == 0
    (tmp_path / "empty").mkdir()
    pd.DataFrame({"identity": pd.Series(dtype=str), "state": pd.Series(dtype=str)}).to_parquet(
        tmp_path / "empty" / "results.parquet")
    rc, err = run("--sweep", str(tmp_path / "empty"))
    assert rc == 2 and "has no trials" in err and err.strip().count("\n") == 0
    pd.DataFrame({"identity": ["a"], "state": ["FAIL"], "final_val_loss": [None]}).to_parquet(
        tmp_path / "empty" / "results.parquet")
    rc, err = run("--sweep", str(tmp_path / "empty"))
    assert rc == 2 and "no COMPLETE trial" in err and err.strip().count("\n") == 0


# --- statistics on known answers -----------------------------------------------------------------

@pytest.mark.parametrize("E,A,alpha", [(2.0, 40.0, 0.3), (3.5, 400.0, 0.5), (1.2, 8.0, 0.15)])
def test_power_law_fit_recovers_known_parameters(E, A, alpha):
    rng = np.random.default_rng(0)
    n = np.geomspace(1e6, 1e9, 7)
    loss = E + A * n**-alpha
    fit = fit_power_law(n, loss + rng.normal(0, 2e-4, len(n)))
    assert fit.E == pytest.approx(E, rel=0.02)
    assert fit.alpha == pytest.approx(alpha, rel=0.03)
    assert fit.A == pytest.approx(A, rel=0.05)
    # n_eff inverts the law: the loss of a 1.44x larger baseline gives back 1.44 N.
    assert fit.n_eff(E + A * (1.44 * 3e7) ** -alpha) / 3e7 == pytest.approx(1.44, rel=0.03)
    exact = fit_power_law(n[[0, 3, 6]], loss[[0, 3, 6]])  # three sizes: the fit is exact
    assert (exact.E, exact.alpha) == pytest.approx((E, alpha), rel=1e-3)


def test_power_law_needs_three_sizes():
    with pytest.raises(ValueError, match="three"):
        fit_power_law([1e6, 1e7], [3.0, 2.5])


def test_effective_size_recovers_a_known_gain(tmp_path):
    sweep = load([synthetic_sweep(tmp_path, gain=0.44)])
    es = effective_size(sweep, baseline_gamma=0.5, n_boot=200)
    assert es.status == "fit"
    assert es.fit.alpha == pytest.approx(0.25, rel=0.15)
    g = es.gains
    assert len(g) == 4 and (g["interval"] == "seed bootstrap").all()
    assert g["gain"].mean() == pytest.approx(0.44, abs=0.08)
    assert (g["gain_lo"] > 0).all() and (g["gain_lo"] < g["gain"]).all() and (g["gain"] < g["gain_hi"]).all()
    claim = claims_mod.effective_size_claim(es, g["variant"].iloc[0])
    assert claim.verdict == "supported"


def test_effective_size_report_from_several_sizes(tmp_path):
    d = synthetic_sweep(tmp_path, gain=-0.3)
    out = build([d], tmp_path / "reports", widths=(64, 128), n_boot=50, log=lambda _: None)
    s = json.loads((out / "summary.json").read_text())
    assert s["effective_size"]["fit"]["E"] == pytest.approx(2.0, abs=0.1)
    assert np.mean([g["gain"] for g in s["effective_size"]["gains"]]) == pytest.approx(-0.3, abs=0.08)
    assert claim(s, "effective model size")["verdict"] == "contradicted"  # smaller, beyond the seed spread
    assert "effective_size.png" in {f["file"] for f in s["figures"]}


def test_the_scale_table_states_each_sizes_passes(tmp_path):
    from smallinit.experiments.report.sections import scale_table

    d = synthetic_sweep(tmp_path, gain=0.2)
    df = pd.read_parquet(d / "results.parquet")
    df.assign(corpus_tokens=np.where(df["model"] == "m0", 4_000, 40_000)).to_parquet(d / "results.parquet")
    table, info = scale_table(load([d]))
    assert list(table["passes"]) == ["2.50", "0.25", "0.25", "0.25"]  # tokens 10,000 / corpus tokens
    assert info["max_passes"] == 2.5
    # A table written before trials recorded their corpus still reports.
    df.to_parquet(d / "results.parquet")
    table, info = scale_table(load([d]))
    assert set(table["passes"]) == {"not recorded"} and info["max_passes"] is None


def test_paired_comparison_and_verdicts():
    rng = np.random.default_rng(0)
    seeds = pd.DataFrame({"init_seed": range(6), "train_seed": 0})
    luck = rng.normal(0, 0.05, 6)  # large seed spread, shared by both arms
    a = seeds.assign(v=3.0 + luck - 0.01 + rng.normal(0, 1e-3, 6))
    b = seeds.assign(v=3.0 + luck)
    c = compare(a, b, "v")
    assert c.paired and c.n == 6 and c.status == A_LOWER and c.diff == pytest.approx(-0.01, abs=3e-3)
    assert compare(a.iloc[:1], b.iloc[:1], "v").status == ONE_SEED
    noisy = seeds.assign(v=3.0 + rng.normal(0, 0.05, 6))
    assert compare(noisy.iloc[:3], b.iloc[:3], "v").status in (WITHIN, A_LOWER, A_HIGHER)
    assert verdict([c], A_LOWER)[0] == "supported"
    assert verdict([c], A_HIGHER)[0] == "contradicted"
    assert verdict([compare(a.iloc[:1], b.iloc[:1], "v")], A_LOWER) == ("inconclusive", "1 with one seed (no interval)")
    assert verdict([], A_LOWER)[0] == "not run"


def test_delta_sym_is_the_stated_formula():
    rng = np.random.default_rng(0)
    la, lb = rng.uniform(0, 12, 1000), rng.uniform(0, 12, 1000)
    pa, pb = np.exp(-la), np.exp(-lb)
    np.testing.assert_allclose(delta_sym(la, lb), (pa - pb) / (pa + pb), rtol=1e-9, atol=1e-12)
    assert delta_sym(50.0, 800.0) == pytest.approx(1.0)  # stable where exp underflows


def test_residual_balance_eps_on_built_norms_equals_a_rebuild():
    import torch

    from smallinit.experiments.claims.mechanism import residual_balance
    from smallinit.model import InitConfig, ModelConfig, NormConfig, Transformer
    from smallinit.model.probes import activation_probes

    rb = residual_balance(widths=(128,), gammas=(1.25,), eps_values=(1e-12, 1e-5))
    cfg = ModelConfig(d_model=128, n_layers=2, n_heads=2, d_ff=256, vocab_size=256, max_seq_len=32,
                      tie_embeddings=True, norm=NormConfig(eps=1e-5), init=InitConfig(gamma=1.25))
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    fresh = activation_probes(Transformer(cfg), idx)
    row = rb[rb["eps"] == 1e-5].iloc[0]
    assert row["residual_ratio"] == pytest.approx(fresh["residual_ratio/mean"], rel=1e-5)
    assert row["saturation"] == pytest.approx(fresh["saturation/mean"], rel=1e-5)
    assert row["saturation"] < rb[rb["eps"] == 1e-12].iloc[0]["saturation"]


def test_importances_need_a_search_space(tmp_path):
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    from smallinit.experiments.data.importance import importances

    def make(name: str, dists: dict, n: int, sampled: bool | None = True) -> Path:
        d = tmp_path / name
        d.mkdir()
        study = optuna.create_study(study_name=name, storage=f"sqlite:///{d / 'optuna.db'}")
        rng = np.random.default_rng(0)
        marks = {} if sampled is None else {"sampled": sampled}  # None: a study from before the mark
        for i in range(n):
            params = {k: (float(rng.uniform(v.low, v.high)) if isinstance(v, FloatDistribution) else v.choices[i % 2])
                      for k, v in dists.items()}
            value = 3.0 + (params.get("init.gamma", 1.0) - 1.0) ** 2 + 1e-3 * params.get("optim.lr", 0.0)
            study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value,
                                                      user_attrs={"identity": f"{name}{i}", **marks}))
        return d

    search = {"init.gamma": FloatDistribution(0.25, 1.5), "optim.lr": FloatDistribution(1e-4, 1e-2)}
    values, note = importances(make("search", search, 12), pd.DataFrame({"identity": [f"search{i}" for i in range(12)]}))
    assert values is not None and set(values) == set(search) and sum(values.values()) == pytest.approx(1.0)
    assert max(values, key=values.get) == "init.gamma"
    assert "2 parameter(s)" in note and "one parameter" not in note  # no caveat that contradicts the count
    one = importances(make("one_param", {"init.gamma": search["init.gamma"]}, 12), pd.DataFrame({"identity": []}))
    assert one[0] == {"init.gamma": 1.0} and "With one parameter its importance is 1" in one[1]
    # A grid records its values as ranges: the study's marks say it was not searched, and the
    # section is left out (no sentence); a study from before the marks, all categorical, too.
    assert importances(make("grid", search, 8, sampled=False), pd.DataFrame({"identity": []})) == (None, "")
    legacy = {"init.gamma": CategoricalDistribution([0.5, 1.0])}
    assert importances(make("legacy", legacy, 4, sampled=None), pd.DataFrame({"identity": []})) == (None, "")
    values, note = importances(make("one", search, 1), pd.DataFrame({"identity": []}))
    assert values is None and "at least 2" in note


def test_label_check_refuses_a_figure_without_units():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    ax.set_title("t")
    ax.set_xlabel("gamma")
    ax.set_ylabel("loss [nats]")
    with pytest.raises(LabelError, match="unit"):
        check_labels(fig)
    ax.set_xlabel("gamma [unitless]")
    assert check_labels(fig)[0]["xlabel"] == "gamma [unitless]"
    plt.close(fig)



def test_the_short_report_command_is_the_report_command():
    import subprocess
    import sys

    short = subprocess.run([sys.executable, "-m", "smallinit.experiments.report", "--help"], capture_output=True, text=True)
    full = subprocess.run([sys.executable, "-m", "smallinit.experiments.report.report", "--help"], capture_output=True, text=True)
    assert short.returncode == full.returncode == 0 and short.stdout == full.stdout and "--sweep" in short.stdout
