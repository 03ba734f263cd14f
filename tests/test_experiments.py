"""The paper's studies as named experiments: each composes, validates and has the grid it says."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from smallinit.sweeper.config import protocol
from smallinit.sweeper.config.config import ProtocolConf
from smallinit.sweeper.config.space import parse_sweep

from .conftest import compose_with_hydra, grid_trials, trial_of

# experiment -> (grid size, preset(s)). A select-then-confirm experiment's grid is its
# settings x the tuned lrs (the seeds come from hydra.sweeper.protocol): stage 1's first round.
EXPECTED = {
    "gamma_scan": (12, {"micro"}),
    "eps_fix": (6, {"micro"}),
    "gate": (12, {"micro"}),
    "scaling": (36, {"nano", "micro", "mini"}),
    "moe": (6, {"micro-moe"}),
    "anchor": (12, {"nano"}),
    "width_trend": (18, {"micro"}),
    "bf16_check": (6, {"micro"}),
    "crossover": (8, {"micro"}),
    "crossover_cosine": (16, {"micro"}),
    "crossover_widths": (6, {"micro"}),
    "crossover_registry": (8, {"micro"}),
    "registry_widths": (9, {"micro"}),
    "gpu/gamma_scan": (15, {"0.1b"}),
    "gpu/eps_fix": (12, {"0.5b"}),
    "gpu/gate": (18, {"0.1b"}),
    "gpu/scaling": (24, {"0.1b", "0.25b", "0.5b", "1b"}),
    "gpu/moe": (6, {"moe-0.5b"}),
    "gpu/anchor": (64, {"nano"}),
}
# The CPU records run select, then confirm: experiment -> (stage 1's first round, stage 2) trials.
STAGES = {"gamma_scan": (12, 24), "eps_fix": (6, 8), "gate": (12, 16), "moe": (6, 16), "anchor": (12, 16),
          "width_trend": (18, 24), "gpu/gamma_scan": (15, 20), "gpu/eps_fix": (12, 16), "gpu/gate": (18, 24),
          "gpu/moe": (6, 8), "gpu/scaling": (24, 32), "crossover": (8, 12), "crossover_widths": (6, 12)}


# gpu/anchor composes 128 grid points (~35 s on 2 cores): in the slow set.
@pytest.mark.parametrize("experiment", [pytest.param(e, marks=pytest.mark.slow) if e == "gpu/anchor" else e for e in EXPECTED])
def test_experiment_composes_into_its_grid(experiment, data_cache):
    size, presets = EXPECTED[experiment]
    base, trials = grid_trials(experiment)
    assert len(trials) == size
    assert {t.preset for t in trials} == presets
    assert len({t.identity() for t in trials}) == size  # every grid point is a distinct trial
    assert base.name == experiment.replace("/", "_")
    if experiment.startswith("gpu/") and experiment != "gpu/anchor":
        for t in trials:  # Chinchilla: 20 tokens per active parameter
            ungated = t.model.replace(attn=dataclasses.replace(t.model.attn, gate="none"))
            assert t.train.max_tokens == pytest.approx(20 * ungated.num_params(active=True), rel=1e-6)
            assert t.train.compile == "true" and t.model.vocab_size == 32768


def test_crossover_registry_is_the_crossovers_design_on_text_seen_once(data_cache):
    """The crossover's model, batch, evaluation and 102-step warmup on data=registry, every budget
    under a third of a pass over the corpus's measured training tokens (docs/data/registry_corpus.json)."""
    import json

    from .conftest import REPO

    _, trials = grid_trials("crossover_registry")
    _, crossover = grid_trials("crossover")
    corpus = json.loads((REPO / "docs" / "data" / "registry_corpus.json").read_text())["n_train_tokens"]
    for t, c in zip(trials, crossover):
        assert t.data.corpus == "registry" and t.model == c.model and t.train.budgets[-1] == 16 * 2**20
        assert (t.train.batch_size, t.train.seq_len, t.train.eval_tokens) == (c.train.batch_size, c.train.seq_len, c.train.eval_tokens)
        assert round(t.optim.warmup_frac * t.train.total_steps) == round(c.optim.warmup_frac * c.train.total_steps) == 102
        assert max(t.train.budgets) < corpus / 3


def test_registry_widths_share_crossover_registrys_schedule_at_every_budget_they_hold(data_cache):
    """The baseline at 96, 192 and 256 on the same corpus, evaluation and batch, whose every budget is
    crossover_registry's branch of that budget step for step: the same 102-step warmup, and each
    cooldown the same fraction of its budget's steps."""
    from smallinit.trainer.schedule import budget_branches, budget_warmup

    _, widths = grid_trials("registry_widths")
    _, registry = grid_trials("crossover_registry")
    assert {t.model.d_model for t in widths} == {96, 192, 256} and {t.model.init.gamma for t in widths} == {0.5}
    base = registry[0]
    for t in widths:
        assert (t.model.n_layers, t.model.n_heads, t.data) == (base.model.n_layers, base.model.n_heads, base.data)
        assert (t.train.batch_size, t.train.seq_len, t.train.eval_tokens, t.train.dtype, t.train.cooldown_frac) == (
            base.train.batch_size, base.train.seq_len, base.train.eval_tokens, base.train.dtype, base.train.cooldown_frac)
        assert set(t.train.budgets) <= set(base.train.budgets) and not t.train.keep_weights
    steps = base.train.tokens_per_step
    ours = budget_branches(widths[0].train.budgets, steps, widths[0].train.cooldown_frac)
    theirs = {b.tokens: b for b in budget_branches(base.train.budgets, steps, base.train.cooldown_frac)}
    assert budget_warmup(ours, widths[0].optim) == budget_warmup(list(theirs.values()), base.optim) == 102
    assert all((b.fork, b.steps) == (theirs[b.tokens].fork, theirs[b.tokens].steps) for b in ours)


def test_scaling_arms_pair_the_papers_recipes(data_cache):
    _, trials = grid_trials("scaling")
    arms = {(t.model.init.gamma, t.model.norm.eps, t.model.attn.gate) for t in trials}
    assert arms == {(0.5, 1e-5, "none"), (1.0, 1e-12, "elementwise")}
    # Paired seeds: the same seed drives the weights and the data order.
    assert all(t.model.init.seed == t.train.seed for t in trials)


def test_eps_fix_runs_at_a_width_where_saturation_bites(data_cache):
    _, trials = grid_trials("eps_fix")
    assert {t.model.d_model for t in trials} == {512}
    assert {t.model.init.gamma for t in trials} == {1.0}  # eps matters only at small init


def plan(experiment):
    """(base config, its protocol, its sweep space): what the sweeper reads."""
    base = compose_with_hydra([f"+experiment={experiment}"])
    conf = ProtocolConf(**OmegaConf.to_container(base.hydra.sweeper.protocol))
    return base, conf, parse_sweep([], OmegaConf.to_container(base.hydra.sweeper.params))


@pytest.mark.parametrize("experiment", list(STAGES))
def test_every_form_chooses_the_lr_on_tuning_seeds_and_compares_on_four_or_more_others(experiment, data_cache):
    base, conf, space = plan(experiment)
    protocol.check(conf, space, asha=bool(base.hydra.sweeper.asha.enabled))  # the sweep would not refuse it
    lrs = space.discrete["optim.lr"].values
    assert conf.tune == ["optim.lr"] and len(lrs) >= 3  # a choice can sit inside the grid
    assert len(conf.confirm_seeds) >= 4 and not set(conf.tune_seeds) & set(conf.confirm_seeds)
    # The seed key is the one that moves both the weights and the data order (paired seeds).
    assert conf.seed_key == "seed" and not {"seed", "train.seed", "init.seed"} & set(space.discrete)
    t = trial_of(experiment, f"{conf.seed_key}=7")
    assert t.model.init.seed == t.train.seed == 7
    _, trials = grid_trials(experiment)
    budgets = {(t.preset, t.model.d_model, t.train.max_tokens, t.train.max_steps) for t in trials}
    assert len(budgets) == len({b[:2] for b in budgets})  # one budget for every arm of a size
    # --show prints both stages (sweeper/results/show.py prints these lines).
    stage1, stage2 = protocol.describe_plan(conf, space)
    n_tune, n_confirm = STAGES[experiment]
    assert stage1.startswith("# stage 1 (tune)") and f"= {n_tune} trials;" in stage1
    assert stage2.startswith("# stage 2 (confirm)") and f"= {n_confirm} trials" in stage2
    assert n_tune == len(trials) == len(protocol.settings(conf, space)) * len(lrs) * len(conf.tune_seeds)


@pytest.mark.slow
@pytest.mark.parametrize("experiment", list(STAGES))
def test_cpu_form_show_prints_both_stages(experiment, tmp_path, data_cache):
    from .conftest import run_cli

    proc = run_cli(["--show", "-m", f"+experiment={experiment}"], cwd=tmp_path,
                   env={"SMALLINIT_CACHE": str(data_cache)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    n_tune, n_confirm = STAGES[experiment]
    assert f"# with -m: {n_tune} trial(s), grid" in proc.stdout
    assert "# stage 1 (tune): " in proc.stdout and f"= {n_confirm} trials" in proc.stdout
    assert not (tmp_path / "sweeps").exists()  # nothing ran


def test_gate_runs_both_gammas_with_and_without_the_gate(data_cache):
    """The paper's gate claim is an interaction: the gate's gain at gamma 1 against its gain at
    gamma 0.5, so the record holds all four cells and nothing else differs between them."""
    _, trials = grid_trials("gate")
    cells = {(t.model.init.gamma, t.model.attn.gate) for t in trials}
    assert cells == {(0.5, "none"), (0.5, "elementwise"), (1.0, "none"), (1.0, "elementwise")}
    assert {t.model.norm.eps for t in trials} == {1e-12} and {t.model.d_model for t in trials} == {128}
    assert {t.model.n_heads for t in trials} == {4}  # heads of 32, as in the last gate record


def test_width_trend_scales_width_at_fixed_depth_and_head_size(data_cache):
    _, trials = grid_trials("width_trend")
    assert {t.model.d_model for t in trials} == {64, 128, 192}
    for t in trials:
        m = t.model
        assert m.n_layers == 4 and m.head_dim == 32 and m.n_heads == m.d_model // 32 >= 2
        assert m.d_ff == 64 * -(-8 * m.d_model // (3 * 64))  # Llama's 8/3*d, rounded up to 64
        assert t.train.max_tokens == 327680  # one token budget at every width
    arms = {(t.model.init.gamma, t.model.norm.eps, t.model.attn.gate) for t in trials}
    assert arms == {(0.5, 1e-5, "none"), (1.0, 1e-12, "elementwise")}
    assert {t.optim.lr for t in trials} == {1e-3, 3e-3, 1e-2}
    assert all(t.model.init.seed == t.train.seed for t in trials)


@pytest.mark.slow
# The crossover forms train train.budgets (and crossover_cosine sweeps train.max_tokens), which
# train.max_steps cannot shrink; their per-budget path runs end to end, report included, in
# tests/test_select_per_budget.py. registry_widths trains them on data=registry too, which needs its
# ~155 MB fetch.
@pytest.mark.parametrize("experiment", [e for e in EXPECTED if not e.startswith(("gpu/", "crossover"))
                                        and e not in ("bf16_check", "registry_widths")])
def test_cpu_form_runs_end_to_end_at_a_reduced_budget(experiment, tmp_path, data_cache):
    import pandas as pd

    from .conftest import run_cli

    # No edge extensions: at 2 steps the lr choice is noise, and the count stays exact.
    extra = ["hydra.sweeper.protocol.max_extensions=0"] if experiment in STAGES else []
    # The anchor task scores all 11,000 of its sequences at each evaluation, most of a 2-step
    # trial's time: a smaller task runs every code path the same.
    if experiment == "anchor":
        extra += ["data.n_train=300", "data.n_test=150", "data.n_unseen=50"]
    proc = run_cli(["-m", f"+experiment={experiment}", "train.max_steps=2", "train.eval_every=2",
                    "train.batch_size=4", "train.seq_len=32", "train.eval_tokens=256", "train.per_token_eval_tokens=128",
                    "train.probe_every=2", "ray.num_cpus=2", "wandb.mode=disabled", *extra],
                   cwd=tmp_path, env={"SMALLINIT_CACHE": str(data_cache)}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_parquet(tmp_path / "sweeps" / experiment / "results.parquet")
    assert len(df) == sum(STAGES.get(experiment, (EXPECTED[experiment][0],))) and set(df["state"]) == {"COMPLETE"}
    if experiment in STAGES:
        assert df["role"].value_counts().to_dict() == dict(zip(("tune", "confirm"), STAGES[experiment]))
    # ... and its report builds, with the experiment's own analysis.
    import json

    from smallinit.experiments.report.report import build

    out = build([tmp_path / "sweeps" / experiment], tmp_path / "reports", widths=(64, 128), n_boot=20,
                log=lambda _: None)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scale"]["complete"] == len(df)
    if experiment == "anchor":
        assert summary["anchor"] and summary["claims"][0]["claim"].startswith("Small init infers")


@pytest.mark.slow
def test_bf16_check_runs_and_reads_the_paired_gap(tmp_path, data_cache):
    """The precision check as a user runs it, on tiny trials: a sweep over train.dtype, then
    `python -m records.dtype_check` on its folder (on a CPU without native bf16 the bf16
    trials are emulated, which these 2-step nano trials afford)."""
    import json

    from records import dtype_check

    from .conftest import run_cli

    proc = run_cli(["-m", "+experiment=bf16_check", "seed=0,1", "model=nano", "train.max_steps=2", "train.eval_every=2",
                    "train.batch_size=4", "train.seq_len=32", "train.eval_tokens=256", "train.per_token_eval_tokens=128",
                    "train.probe_every=2", "ray.num_cpus=2", "wandb.mode=disabled"],
                   cwd=tmp_path, env={"SMALLINIT_CACHE": str(data_cache)}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "gap.json"
    rc = dtype_check.main([str(tmp_path / "sweeps" / "bf16_check"), "--json", str(out)])
    got = json.loads(out.read_text())
    assert got["pairs"] == 2 and len(got["loss_fp32"]) == len(got["loss_bf16"]) == 2
    assert got["gap"] == pytest.approx(sum(b - f for b, f in zip(got["loss_bf16"], got["loss_fp32"])) / 2)
    assert rc == (0 if got["inside_spread"] else 1)


def test_crossover_forms_share_one_model_family_budgets_and_evaluation(data_cache):
    from smallinit.trainer.schedule import budget_branches, budget_warmup

    _, runs = grid_trials("crossover")
    _, widths = grid_trials("crossover_widths")
    _, cosine = grid_trials("crossover_cosine")
    for t in runs + widths + cosine:  # 4 layers, 2 heads at every width, one evaluation set, fp32
        assert (t.model.n_layers, t.model.n_heads) == (4, 2) and t.train.eval_tokens == 65536
        assert t.train.dtype == "fp32" and t.train.batch_size * t.train.seq_len == 1024
    assert {t.model.d_model for t in runs} == {128} and {t.model.d_model for t in widths} == {96, 192}
    assert {t.model.init.gamma for t in widths} == {0.5}  # the baseline only
    for t in runs + widths:
        # The widths run the crossover's budgets from 2M on (where the recipe is level or ahead),
        # with the same warmup: every budget they share is the same schedule.
        full = (524288, 1048576, 2097152, 4194304, 8388608)
        assert t.train.budgets == (full if t in runs else full[2:])
        branches = budget_branches(t.train.budgets, t.train.tokens_per_step, t.train.cooldown_frac)
        warmup = budget_warmup(branches, t.optim)
        assert warmup == 102 and branches[0].fork - warmup >= 300  # the smallest budget keeps a stable phase
    assert {t.train.max_tokens for t in cosine} == {1048576, 4194304} and {t.optim.schedule for t in cosine} == {"cosine"}
