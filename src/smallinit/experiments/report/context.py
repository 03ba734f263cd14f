"""What every section of the report reads: the loaded sweep, where its figures go, the options,
and the analyses that more than one section shows (each computed once, on first use)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from smallinit.experiments.claims import anchor_phase, mechanism, width
from smallinit.experiments.claims import budgets as budget_fit
from smallinit.experiments.claims import claims as claims_mod
from smallinit.experiments.claims.budgets import BudgetFit
from smallinit.experiments.claims.claims import Claim
from smallinit.experiments.claims.mechanism import Balance
from smallinit.experiments.claims.width import WidthTrend
from smallinit.experiments.data.load import ReportError, Sweep, recipe_variant, variant_of
from smallinit.experiments.fits.scaling import EffectiveSize, effective_size
from smallinit.experiments.output.figures import Figures
from smallinit.experiments.output.render import Block
from smallinit.experiments.stats import tokens as token_level
from smallinit.experiments.stats.stats import compare
from smallinit.experiments.stats.tokens import TokenResult

from . import sections_protocol

# What a section returns: its blocks, in page order, and its keys of summary.json.
Part = tuple[list[Block], dict]


def best_gamma_table(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per gamma curve: the gamma with the lowest seed-mean loss, and the runner-up compared paired."""
    rows = []
    for gamma_curve, g in df.groupby("gamma_curve"):
        means = g.groupby("gamma")[metric].mean().sort_values()
        best = float(means.index[0])
        row = dict(gamma_curve=gamma_curve, size=g["size"].iloc[0], setting=g["setting"].iloc[0], best_gamma=best,
                   best_loss=float(means.iloc[0]), seeds=int(g[np.isclose(g["gamma"], best)]["seed"].nunique()),
                   gammas=[float(x) for x in sorted(means.index)], runner_up=None, margin=None, margin_text="")
        if len(means) > 1:
            second = float(means.index[1])
            c = compare(g[np.isclose(g["gamma"], second)], g[np.isclose(g["gamma"], best)], metric)
            row.update(runner_up=second, margin=c.as_dict(), margin_text=c.text())
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass
class TokenComparison:
    """The two variants compared token by token (A then B), per size, or why none was."""

    a: str | None
    b: str | None
    results: list[TokenResult]
    why_not: str | None


@dataclass
class Context:
    sweep: Sweep
    figs: Figures
    metric: str
    baseline_gamma: float
    baseline: dict[str, str] | None  # the baseline's other settings, e.g. {"eps": "1e-5"}
    arms: list[str] | None  # the two token-level selectors of --arms, A then B
    widths: tuple[int, ...]  # residual-balance widths
    gammas: tuple[float, ...]  # residual-balance gammas
    n_boot: int
    log: Callable[[str], object]
    # Every budget's rows where trials ran train.budgets (load.load_report): the L(N, D) fit and
    # the crossover read them; `sweep`, which every other analysis reads, has each trial's largest.
    budget_sweep: Sweep | None = None

    def analyse(self) -> None:
        """The shared analyses in one fixed order, before any section draws: a ReportError (no
        baseline for the fit, a bad --arms) then stops the build before a figure is written."""
        _ = self.effective, self.budgets, self.tokens, self.claims

    @property
    def df(self) -> pd.DataFrame:
        return self.sweep.complete

    @cached_property
    def dtype(self) -> str:
        """What train.dtype resolved to over the compared trials, e.g. "bf16" or "bf16, fp32"."""
        return ", ".join(sorted(str(x) for x in self.df["dtype"].dropna().unique())) or "not recorded"

    @cached_property
    def unigram(self) -> float:
        return self.df["unigram_entropy"].mean()

    @cached_property
    def best(self) -> pd.DataFrame:
        return best_gamma_table(self.df, self.metric)

    @cached_property
    def curves(self) -> pd.DataFrame:
        """Probe curves over training (mechanism.probe_curves)."""
        return mechanism.probe_curves(self.sweep)

    @cached_property
    def step0(self) -> pd.DataFrame:
        c = self.curves
        return c[c["step"] == 0].set_index("identity") if not c.empty else pd.DataFrame()

    @cached_property
    def trajectories(self) -> pd.DataFrame:
        return mechanism.trajectories(self.curves) if not self.curves.empty else pd.DataFrame()

    @cached_property
    def saturation(self) -> pd.DataFrame:
        """Per trial: the norm saturation at init (step-0 probe) and at the end."""
        df, step0 = self.df, self.step0
        return pd.DataFrame({"identity": df["identity"],
                             "init": df["identity"].map(step0["saturation"]) if not step0.empty else np.nan,
                             "final": df["saturation"]})

    @cached_property
    def effective(self) -> EffectiveSize:
        try:
            return effective_size(self.sweep, self.baseline_gamma, self.baseline, self.metric, n_boot=self.n_boot)
        except ValueError as e:
            raise ReportError(str(e)) from None

    @cached_property
    def budgets(self) -> BudgetFit | None:
        """The L(N, D) fit and the crossover surface where the baseline ran at >= 2 budgets and
        >= 2 widths (budgets.py); None for a one-budget sweep, which keeps the L(N) fit."""
        if self.anchor:
            return None
        return budget_fit.analyse(self.budget_sweep or self.sweep, self.base_variant, self.recipe, self.metric,
                                  self.n_boot)

    @cached_property
    def base_variant(self) -> str | None:
        """The effective-size baseline's variant: baseline gamma in the fit's baseline setting."""
        setting, df = self.effective.baseline_setting, self.df
        if not setting:
            return None
        return df[np.isclose(df["gamma"], self.baseline_gamma) & (df["setting"] == setting)]["variant"].iloc[0]

    @cached_property
    def recipe(self) -> str | None:
        return recipe_variant(self.df, self.base_variant)

    @cached_property
    def tokens(self) -> TokenComparison:
        df = self.df
        if self.arms:
            if len(self.arms) != 2:
                raise ReportError(f"--arms takes two selectors (A then B), got {len(self.arms)}")
            a, b = variant_of(df, self.arms[0]), variant_of(df, self.arms[1])
        else:
            a, b = self.recipe, self.base_variant
        results, notes = [], []
        if a and b and a != b:
            for size in df.sort_values("n_params")["size"].unique():
                have = set(df[df["size"] == size]["variant"])
                if a in have and b in have:
                    r = token_level.analyse(self.sweep, a, b, size)
                    (notes if isinstance(r, str) else results).append(r)
        if results:
            why = None
        elif notes:
            why = "; ".join(notes)
        elif b is None:
            why = (f"no trial at the baseline γ = {self.baseline_gamma:g} "
                   "(pass --arms A B, e.g. --arms gamma=1 gamma=0.75)")
        elif a is None or a == b:
            why = "the sweep has only one arm"
        else:
            why = f"{a} and {b} never ran at the same size"
        return TokenComparison(a, b, results, why)

    @cached_property
    def balance(self) -> Balance:
        self.log(f"residual balance at init over widths {list(self.widths)} ...")
        return mechanism.balance_at_init(self.widths, self.gammas)

    @cached_property
    def width_trend(self) -> WidthTrend:
        return width.width_trend(self.df, self.recipe, self.base_variant, self.metric)

    @cached_property
    def anchor(self) -> bool:
        """An anchor-task sweep: its loss is not a language-modelling loss, only its own claim applies."""
        return anchor_phase.has_anchor(self.df)

    @cached_property
    def claims(self) -> list[Claim]:
        slopes = self.balance.slopes
        if self.anchor:
            return [anchor_phase.anchor_claim(self.df), claims_mod.residual_claim(slopes)]
        sweep, metric, tok, bf = self.sweep, self.metric, self.tokens, self.budgets
        if bf is not None:  # several budgets: the L(N, D) fit and the crossover surface decide these
            effective, trend = [budget_fit.effective_size_claim(bf)], budget_fit.trend_claims(bf)
        else:
            effective = [claims_mod.effective_size_claim(self.effective, self.recipe)]
            trend = [sections_protocol.width_claim(self.width_trend)]
        return [
            claims_mod.best_gamma_claim(sweep, self.best, metric),
            claims_mod.eps_claim(sweep, metric, self.saturation),
            claims_mod.gate_claim(sweep, metric),
            claims_mod.recipe_claim(sweep, self.base_variant, self.recipe, metric),
            claims_mod.token_claim(tok.results, tok.why_not),
            claims_mod.condensation_claim(self.trajectories),
            *effective,
            *trend,
            claims_mod.residual_claim(slopes),
        ]
