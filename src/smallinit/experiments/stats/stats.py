"""Paired comparisons between variants: the one rule every verdict in the report goes through.

At CPU scale variants differ by a few hundredths of a nat and one seed to another can differ by
more, so two variants are compared on the seeds they share (same init noise, same data order):
d_s = value_A(s) - value_B(s). The difference is called real only when the 95% t-interval of
mean(d_s) excludes 0. One shared seed decides nothing.

A ranking read while the gap is still moving ranks learning speed, not end points: where the
trials logged validation loss during training, the paired gap is computed at every evaluation,
and a comparison counts only if the sign of the mean gap held over the last quarter of
training (curves.py).

Each loss comparison is at each side's own best lr (tuning.py). Where the side behind chose the
smallest or largest lr tried, a wider grid can only lower its loss and so shrink the gap: the
difference is not called real until that grid is widened.

Verdicts: supported (every comparison real in the predicted direction, rankings settled: an
intersection-union test, which needs no correction for the number of comparisons),
contradicted (one real and settled in the opposite direction after Holm's correction over the
claim's comparisons: the one-sided t p against the claim, adjusted, at most ALPHA_ONE_SIDED),
inconclusive (the rest, with the smallest effect the data excludes), not run (nothing to
compare). Each paired comparison also carries an exact sign-flip p (no normality assumed),
shown beside the t-interval (paired.py); with n pairs it cannot go below 2/2^n (0.25 at n = 3). Every
trial is scored on the same validation tokens, so the t-interval leaves out validation-sampling
error: loss comparisons whose trials saved per-token losses also carry that SE, the seed SE and
an interval from a bootstrap over seeds and validation windows (valnoise.py), beside the t-interval.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from smallinit.experiments.data.load import SEED_COLS
from smallinit.experiments.data.tuning import EDGE_COL, OPTIM_COLS, ROLE_COL, TUNE_SEEDS_COL

from . import valnoise
from .curves import contrast_over_training, gap_over_training, settled
from .paired import holm, signflip_p, t_interval, t_pvalues

ONE_SEED = "one seed"
WITHIN = "within spread"
A_LOWER = "A lower"
A_HIGHER = "A higher"

SUPPORTED, CONTRADICTED, INCONCLUSIVE, NOT_RUN = "supported", "contradicted", "inconclusive", "not run"
VERDICTS = (SUPPORTED, CONTRADICTED, INCONCLUSIVE, NOT_RUN)
# One tail of the two-sided 95% interval: "contradicted" needs the Holm-adjusted one-sided p
# against the claim at or below this.
ALPHA_ONE_SIDED = 0.025


@dataclass
class Comparison:
    n: int  # seed pairs (or, unpaired, the smaller side's trials)
    mean_a: float
    mean_b: float
    diff: float  # mean of value_A - value_B
    lo: float  # 95% interval of diff
    hi: float
    paired: bool
    status: str  # ONE_SEED | WITHIN | A_LOWER | A_HIGHER
    # The paired gap at every evaluation ({step, n, diff, lo, hi}), when the trials logged it.
    over_training: list[dict] | None = None
    # True: the sign of the mean gap held over the last quarter; False: it changed there;
    # None: not checked (no curves, or fewer than two evaluations in the last quarter).
    settled: bool | None = None
    settle_note: str = ""
    # The optimiser settings each side was compared at (each side's own best, tuning.py).
    optim_a: dict | None = None
    optim_b: dict | None = None
    # A real loss difference whose side behind chose an lr at the edge of its grid: which side
    # and why ("" otherwise). Such a difference is not counted until the grid is widened.
    edge_behind: str = ""
    # Paired: the per-pair differences A - B. The t-test's one-sided p for A < B and for A > B,
    # and the exact sign-flip p (two-sided) of the differences' mean.
    diffs: list[float] | None = None
    p_lower: float | None = None
    p_higher: float | None = None
    p_signflip: float | None = None
    # Set by judge() over the claim's comparisons: the one-sided p against the claim's
    # prediction, and that p after Holm's correction over the claim's comparisons.
    p_against: float | None = None
    p_holm: float | None = None
    # Select-then-confirm records (a `role` column): the confirm seed pairs compared, and the
    # seeds that chose each side's lr. None: no roles; the lr was chosen on the compared seeds.
    n_confirm: int | None = None
    tune_seeds: list[str] | None = None
    # Loss comparisons whose trials saved per-token losses (valnoise.py): the validation-sampling
    # SE of the mean difference over the W windows the loss averages, the seed SE, their ratio,
    # and the 95% interval of a bootstrap over seeds and validation windows. None otherwise.
    val_se: float | None = None
    seed_se: float | None = None
    val_ratio: float | None = None
    ci_boot: list[float] | None = None
    val_windows: int | None = None

    @property
    def excluded(self) -> float:
        """The smallest |effect| the 95% interval rules out: every effect beyond max(|lo|, |hi|)."""
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return float("nan")
        return max(abs(self.lo), abs(self.hi))

    def as_dict(self) -> dict:
        d = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}
        d["excluded"] = None if not math.isfinite(self.excluded) else self.excluded
        return d

    def text(self, unit: str = "nats") -> str:
        if self.n == 0:
            return "no trials to compare"
        if self.status == ONE_SEED:
            return f"{self.diff:+.4f} {unit} (one seed: no interval)"
        kind = "paired" if self.paired else "unpaired"
        txt = f"{self.diff:+.4f} {unit} [{self.lo:+.4f}, {self.hi:+.4f}] ({kind}, n={self.n})".replace("  ", " ")
        if self.p_signflip is not None:
            txt += f", sign-flip p = {self.p_signflip:.3g}"
        if self.p_holm is not None and self.p_against is not None and self.p_against < ALPHA_ONE_SIDED:
            txt += f"; against the claim p = {self.p_against:.3g}, Holm-adjusted {self.p_holm:.3g}"
        if self.ci_boot is not None:
            txt += (f"; over seeds and validation windows [{self.ci_boot[0]:+.4f}, {self.ci_boot[1]:+.4f}] "
                    f"(validation SE {self.val_se:.4f}, seed SE {self.seed_se:.4f})")
        if self.tune_seeds is not None:
            txt += f"; lr chosen on seed(s) {', '.join(self.tune_seeds) or 'none'}"
        if self.optim_a or self.optim_b:
            txt += f"; at {_optim_text(self.optim_a)} vs {_optim_text(self.optim_b)}"
        if self.settle_note:
            txt += f"; {self.settle_note}"
        if self.edge_behind:
            txt += f"; {self.edge_behind}"
        return txt


def _optim_text(optim: dict | None) -> str:
    if not optim:
        return "?"
    return ", ".join(f"{k} {'/'.join(f'{v:g}' for v in vs)}" for k, vs in optim.items())


def _optim_of(frame: pd.DataFrame) -> dict | None:
    out = {c: sorted(float(v) for v in frame[c].dropna().unique()) for c in OPTIM_COLS if c in frame}
    return {k: v for k, v in out.items() if v} or None


def _against(c: Comparison, want: str) -> float:
    p = c.p_higher if want == A_LOWER else c.p_lower
    return 1.0 if p is None or not math.isfinite(p) else p


def judge(comparisons: list[Comparison], wants: list[str] | str) -> None:
    """Set p_against (the one-sided p against each comparison's predicted direction) and p_holm
    (Holm over these comparisons, the claim's family) on every comparison run. A comparison
    with no p (one seed) counts in the family as p = 1: it was run, it cannot reject."""
    wants = [wants] * len(comparisons) if isinstance(wants, str) else list(wants)
    run = [(c, w) for c, w in zip(comparisons, wants) if c.n > 0]
    against = [_against(c, w) for c, w in run]
    for (c, _), p, adj in zip(run, against, holm(against)):
        c.p_against, c.p_holm = p, adj


def _status(n: int, lo: float, hi: float) -> str:
    if n < 2 or not math.isfinite(lo):
        return ONE_SEED
    if hi < 0:
        return A_LOWER
    if lo > 0:
        return A_HIGHER
    return WITHIN


def from_diffs(d, mean_a: float = float("nan"), mean_b: float = float("nan")) -> Comparison:
    """A Comparison from per-seed-pair differences already computed."""
    d = np.asarray(d, dtype=float)
    m, lo, hi = t_interval(d) if len(d) else (float("nan"),) * 3
    return _with_p(Comparison(len(d), mean_a, mean_b, m, lo, hi, True, _status(len(d), lo, hi)), d)


def _with_p(c: Comparison, d: np.ndarray) -> Comparison:
    """Fill the paired comparison's differences and p-values."""
    c.diffs = [float(x) for x in d]
    if len(d) >= 2:
        c.p_lower, c.p_higher = t_pvalues(d)
        c.p_signflip = signflip_p(d)
    return c


def compare(a: pd.DataFrame, b: pd.DataFrame, value: str, pair_cols=SEED_COLS, curve: str | None = None) -> Comparison:
    """value(A) - value(B), paired on the seeds both have; unpaired (Welch) if they share none.
    With `curve` (a metrics.jsonl key such as "val/loss"), `value` is a loss, the quantity the
    lrs were tuned on: also the paired gap over training, whether its ranking settled, and
    whether the side behind sits at the edge of its lr grid."""
    a = a[np.isfinite(a[value].astype(float))]
    b = b[np.isfinite(b[value].astype(float))]
    c = _compare(a, b, value, pair_cols)
    c.optim_a, c.optim_b = _optim_of(a), _optim_of(b)
    if curve and c.paired and c.n > 0:
        c.over_training = gap_over_training(a, b, curve, pair_cols)
        c.settled, c.settle_note = settled(c.over_training, c.diff)
    if curve and c.status in (A_HIGHER, A_LOWER):
        side, behind = ("A", a) if c.status == A_HIGHER else ("B", b)
        edges = sorted({e for e in behind.get(EDGE_COL, pd.Series(dtype=str)).dropna() if e})
        if edges:
            c.edge_behind = f"the side behind ({side}) is at the edge of its grid: {'; '.join(edges)}"
    if curve:
        _attach_valnoise(c, (a, b), (1, -1), value, pair_cols)
    return _roles(c, (a, b))


def _roles(c: Comparison, frames) -> Comparison:
    """Select-then-confirm records: the confirm pairs compared and the seeds that chose the lrs."""
    if any(ROLE_COL in f and f[ROLE_COL].notna().any() for f in frames):
        c.n_confirm = c.n
        c.tune_seeds = sorted({s.strip() for f in frames for v in f.get(TUNE_SEEDS_COL, pd.Series(dtype=str)).dropna()
                               for s in str(v).split(",") if s.strip()}, key=_seed_order)
    return c


def _seed_order(label: str):
    head = label.split("/")[0]
    return (0, int(head), label) if head.lstrip("-").isdigit() else (1, 0, label)


def interaction(a1: pd.DataFrame, b1: pd.DataFrame, a0: pd.DataFrame, b0: pd.DataFrame, value: str,
                pair_cols=SEED_COLS, curve: str | None = None) -> Comparison:
    """(A1 - B1) - (A0 - B0) per seed shared by all four: how much more A beats B in one context
    (1) than in another (0), e.g. the gate's gain at γ = 1 minus its gain at γ = 0.5. With
    `curve`, the same contrast at every evaluation and whether its sign held."""
    frames = [f[np.isfinite(f[value].astype(float))] for f in (a1, b1, a0, b0)]
    cols = list(pair_cols)
    means = [f.groupby(cols)[value].mean() for f in frames]
    shared = means[0].index
    for m in means[1:]:
        shared = shared.intersection(m.index)
    d = ((means[0].loc[shared] - means[1].loc[shared]) - (means[2].loc[shared] - means[3].loc[shared])).to_numpy(float)
    c = from_diffs(d)
    if len(d) == 0:
        c.status = ONE_SEED
        return c
    if curve:
        c.over_training = contrast_over_training(frames, (1, -1, -1, 1), curve, cols)
        c.settled, c.settle_note = settled(c.over_training, c.diff)
        edges = sorted({e for f in frames for e in f.get(EDGE_COL, pd.Series(dtype=str)).dropna() if e})
        if edges and c.status in (A_HIGHER, A_LOWER):
            # Any of the four cells at its grid's edge could move the contrast either way.
            c.edge_behind = f"a cell is at the edge of its lr grid: {'; '.join(edges)}"
        _attach_valnoise(c, frames, (1, -1, -1, 1), value, pair_cols)
    return _roles(c, frames)


def _compare(a: pd.DataFrame, b: pd.DataFrame, value: str, pair_cols) -> Comparison:
    if a.empty or b.empty:
        nan = float("nan")
        return Comparison(0, nan, nan, nan, nan, nan, True, ONE_SEED)
    cols = list(pair_cols)
    ma = a.groupby(cols)[value].mean()
    mb = b.groupby(cols)[value].mean()
    shared = ma.index.intersection(mb.index)
    if len(shared) > 0:
        d = (ma.loc[shared] - mb.loc[shared]).to_numpy(dtype=float)
        m, lo, hi = t_interval(d)
        return _with_p(Comparison(len(d), float(ma.loc[shared].mean()), float(mb.loc[shared].mean()), m, lo, hi,
                                  True, _status(len(d), lo, hi)), d)
    xa, xb = ma.to_numpy(dtype=float), mb.to_numpy(dtype=float)
    diff = float(xa.mean() - xb.mean())
    n = min(len(xa), len(xb))
    if n < 2:
        return Comparison(n, float(xa.mean()), float(xb.mean()), diff, float("nan"), float("nan"), False, ONE_SEED)
    va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
    se = math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1)) if se > 0 else 1.0
    half = stats.t.ppf(0.975, dof) * se
    c = Comparison(n, float(xa.mean()), float(xb.mean()), diff, diff - half, diff + half, False,
                   _status(n, diff - half, diff + half))
    if se > 0:  # Welch's one-sided p-values; no sign flips without pairs
        c.p_lower, c.p_higher = float(stats.t.cdf(diff / se, dof)), float(stats.t.sf(diff / se, dof))
    return c


def outcome(c: Comparison, want: str) -> str:
    """One comparison's own verdict. Against the claim it counts only if it survives Holm over
    the claim's comparisons (judge(); before that, a family of one: the interval's own rule)."""
    against = A_HIGHER if want == A_LOWER else A_LOWER
    if c.n == 0:
        return NOT_RUN
    if not _counts(c):
        return INCONCLUSIVE
    if c.status == against:
        return CONTRADICTED if c.p_holm is None or c.p_holm <= ALPHA_ONE_SIDED else INCONCLUSIVE
    if c.status == want:
        return SUPPORTED
    return INCONCLUSIVE


def _counts(c: Comparison) -> bool:
    """A difference that may count: an interval, a ranking that held (where checked), the side
    behind inside its lr grid."""
    return not (c.status == ONE_SEED or c.settled is False or (c.over_training is not None and c.settled is None)
                or c.edge_behind)


def verdict(comparisons: list[Comparison], want: str, unit: str = "nats") -> tuple[str, str]:
    """Aggregate comparisons that a claim predicts all come out `want` (A_LOWER or A_HIGHER).

    supported: every one is real, settled and in the predicted direction. contradicted: one is
    real and settled in the opposite direction after Holm over the comparisons (unless a claim
    judged a larger family first). not run: none. Otherwise inconclusive, saying why and which
    effects the data excludes."""
    comparisons = [c for c in comparisons if c.n > 0]
    if not comparisons:
        return NOT_RUN, "no arms to compare"
    # Judged already, for this direction, in the claim's (possibly larger) family: keep that.
    if any(c.p_holm is None or c.p_against != _against(c, want) for c in comparisons):
        judge(comparisons, want)
    outcomes = [outcome(c, want) for c in comparisons]
    held = " (rankings held over the last quarter of training)" if any(c.settled for c in comparisons) else ""
    if CONTRADICTED in outcomes:
        k = outcomes.count(CONTRADICTED)
        p = min(c.p_holm for c, o in zip(comparisons, outcomes) if o == CONTRADICTED)
        return CONTRADICTED, (f"{k} of {len(comparisons)} difference(s) real in the opposite direction, after Holm "
                              f"over the claim's comparisons (adjusted one-sided p = {p:.3g} ≤ {ALPHA_ONE_SIDED}){held}")
    if all(o == SUPPORTED for o in outcomes):
        return SUPPORTED, f"every difference exceeds its seed spread in the predicted direction{held}"
    why = []
    against = A_HIGHER if want == A_LOWER else A_LOWER
    corrected = [c for c in comparisons if c.status == against and _counts(c)]  # only Holm stopped them
    if corrected:
        p = min(c.p_holm for c in corrected)
        why.append(f"{len(corrected)} beyond the seed spread in the opposite direction, but not after Holm over "
                   f"the claim's comparisons (adjusted one-sided p = {p:.3g} > {ALPHA_ONE_SIDED})")
    one = [c for c in comparisons if c.status == ONE_SEED]
    moving = [c for c in comparisons if c.settled is False and c.status != ONE_SEED]
    unchecked = [c for c in comparisons if c.over_training is not None and c.settled is None and c.status != ONE_SEED]
    at_edge = [c for c in comparisons if c.edge_behind and c.settled is not False
               and not (c.over_training is not None and c.settled is None)]
    nulls = _nulls(comparisons)
    if one:
        why.append(f"{len(one)} with one seed (no interval)")
    if moving:
        why.append(f"{len(moving)} with the ranking still changing in the last quarter of training")
    if unchecked:
        why.append(f"{len(unchecked)} whose last-quarter ranking was not checked")
    if at_edge:
        why.append(f"{len(at_edge)} beyond the seed spread but with the side behind at the edge of its lr grid "
                   "(widen the grid: a better lr there can only close the gap)")
    if nulls:
        x = max(c.excluded for c in nulls)
        lo, hi = min(c.n for c in nulls), max(c.n for c in nulls)
        pairs = f"{lo}" if lo == hi else f"{lo}-{hi}"
        what = "comparison" if len(nulls) == 1 else "comparisons"
        why.append(f"{len(nulls)} {what} within the seed spread ({pairs} pairs): "
                   f"|effect| > {x:.3g} {unit} excluded".replace("  ", " "))
    return INCONCLUSIVE, "; ".join(why) or "not every difference is real"


def _nulls(comparisons: list[Comparison]) -> list[Comparison]:
    """Comparisons inside their spread whose ranking could be checked and did not move."""
    return [c for c in comparisons if c.n > 0 and c.status == WITHIN and c.settled is not False
            and not (c.over_training is not None and c.settled is None)]


def largest_excluded(comparisons: list[Comparison]) -> float | None:
    """For an inconclusive claim: the |effect| beyond which every null comparison rules it out
    (the same comparisons whose bound the verdict's reason states)."""
    xs = [c.excluded for c in _nulls(comparisons) if math.isfinite(c.excluded)]
    return max(xs) if xs else None


def _attach_valnoise(c: Comparison, frames, weights, value: str, pair_cols) -> Comparison:
    """(valnoise.py) Fill c's val_se, seed_se, val_ratio, ci_boot and val_windows (left None where not measurable)."""
    if not c.paired or c.n < 2:
        return c
    v = valnoise.for_contrast(frames, weights, value, pair_cols)
    if v is not None:
        c.val_se, c.seed_se, c.val_ratio, c.ci_boot, c.val_windows = v.val_se, v.seed_se, v.ratio, v.ci_boot, v.windows
    return c
