"""Paired comparisons between variants: the one rule every verdict in the report goes through.

At CPU scale variants differ by a few hundredths of a nat and one seed to another can differ by
more, so two variants are compared on the seeds they share (same init noise, same data order):
d_s = value_A(s) - value_B(s). The difference is called real only when the 95% t-interval of
mean(d_s) excludes 0. One shared seed decides nothing.

A ranking read while the gap is still moving ranks learning speed, not end points: where the
trials logged validation loss during training, the paired gap is computed at every evaluation,
and a comparison counts only if the sign of the mean gap held over the last quarter of
training (SETTLE_FRACTION).

Each loss comparison is at each side's own best lr (tuning.py). Where the side behind chose the
smallest or largest lr tried, a wider grid can only lower its loss and so shrink the gap: the
difference is not called real until that grid is widened.

Verdicts: supported (every comparison real in the predicted direction, rankings settled),
contradicted (one real and settled in the opposite direction), inconclusive (the rest, with
the smallest effect the data excludes), not run (nothing to compare).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from .load import SEED_COLS, read_metrics
from .tuning import EDGE_COL, OPTIM_COLS

ONE_SEED = "one seed"
WITHIN = "within spread"
A_LOWER = "A lower"
A_HIGHER = "A higher"

SUPPORTED, CONTRADICTED, INCONCLUSIVE, NOT_RUN = "supported", "contradicted", "inconclusive", "not run"
VERDICTS = (SUPPORTED, CONTRADICTED, INCONCLUSIVE, NOT_RUN)
# The ranking must hold over this last fraction of training to count.
SETTLE_FRACTION = 0.25


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
        txt = f"{self.diff:+.4f} {unit} [{self.lo:+.4f}, {self.hi:+.4f}] ({kind}, n={self.n})"
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


def t_interval(d: np.ndarray) -> tuple[float, float, float]:
    d = np.asarray(d, dtype=float)
    m = float(d.mean())
    if len(d) < 2:
        return m, float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return m, m - half, m + half


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
    return Comparison(len(d), mean_a, mean_b, m, lo, hi, True, _status(len(d), lo, hi))


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
    return c


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
        return Comparison(len(d), float(ma.loc[shared].mean()), float(mb.loc[shared].mean()), m, lo, hi, True,
                          _status(len(d), lo, hi))
    xa, xb = ma.to_numpy(dtype=float), mb.to_numpy(dtype=float)
    diff = float(xa.mean() - xb.mean())
    n = min(len(xa), len(xb))
    if n < 2:
        return Comparison(n, float(xa.mean()), float(xb.mean()), diff, float("nan"), float("nan"), False, ONE_SEED)
    va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
    se = math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1)) if se > 0 else 1.0
    half = stats.t.ppf(0.975, dof) * se
    return Comparison(n, float(xa.mean()), float(xb.mean()), diff, diff - half, diff + half, False,
                      _status(n, diff - half, diff + half))


def _curves(frame: pd.DataFrame, key: str, pair_cols) -> pd.DataFrame:
    """Per seed pair and step: the mean of `key` over the frame's trials with that seed."""
    rows = []
    for _, r in frame.iterrows():
        m = _read_metrics(r.get("metrics_path"))
        if m.empty or key not in m:
            continue
        m = m[["step", key]].dropna()
        rows.append(m.assign(**{c: r[c] for c in pair_cols}))
    if not rows:
        return pd.DataFrame()
    return pd.concat(rows).groupby([*pair_cols, "step"])[key].mean()


def _read_metrics(path) -> pd.DataFrame:
    # Several claims compare the same trials: read each curve once per report.
    return _read_metrics_cached(path) if isinstance(path, str) else pd.DataFrame()


@functools.lru_cache(maxsize=4096)
def _read_metrics_cached(path: str) -> pd.DataFrame:
    return read_metrics(path)


def gap_over_training(a: pd.DataFrame, b: pd.DataFrame, key: str, pair_cols=SEED_COLS) -> list[dict] | None:
    """The paired gap A - B at every evaluation both sides logged, with its 95% interval."""
    ca, cb = _curves(a, key, list(pair_cols)), _curves(b, key, list(pair_cols))
    if len(ca) == 0 or len(cb) == 0:
        return None
    joined = pd.concat({"a": ca, "b": cb}, axis=1).dropna()
    if joined.empty:
        return None
    out = []
    for step, g in joined.groupby(level="step"):
        m, lo, hi = t_interval((g["a"] - g["b"]).to_numpy())
        out.append(dict(step=int(step), n=len(g), diff=m, lo=lo if math.isfinite(lo) else None,
                        hi=hi if math.isfinite(hi) else None))
    return out


def settled(trend: list[dict] | None, final: float | None = None,
            fraction: float = SETTLE_FRACTION) -> tuple[bool | None, str]:
    """Did the sign of the mean gap hold over the last `fraction` of training? The sign is the
    comparison's own final gap (`final`; default the curve's last point), and training ends at
    the last evaluation every seed pair logged."""
    if not trend:
        return None, "no gap over training (no logged validation curves)"
    pairs = max(t["n"] for t in trend) if all("n" in t for t in trend) else None
    full = [t for t in trend if pairs is None or t["n"] == pairs]
    last = full[-1]["step"]
    tail = [t for t in full if (1 - fraction) * last <= t["step"] and t["step"] > 0]
    if len(tail) < 2:
        return None, (f"ranking over the last {fraction:.0%} of training not checked: {len(tail)} evaluation(s) "
                      "there (evaluate more often)")
    final = full[-1]["diff"] if final is None or not math.isfinite(final) else final
    flips = [t["step"] for t in tail if np.sign(t["diff"]) != np.sign(final)]
    if flips:
        return False, (f"ranking still changing: the mean gap had the other sign at step {flips[-1]} of {last} "
                       f"(final {final:+.4f})")
    return True, f"ranking held over the last {fraction:.0%} of training ({len(tail)} evaluations)"


def outcome(c: Comparison, want: str) -> str:
    """One comparison's own verdict."""
    against = A_HIGHER if want == A_LOWER else A_LOWER
    if c.n == 0:
        return NOT_RUN
    if (c.status == ONE_SEED or c.settled is False or (c.over_training is not None and c.settled is None)
            or c.edge_behind):
        return INCONCLUSIVE
    if c.status == against:
        return CONTRADICTED
    if c.status == want:
        return SUPPORTED
    return INCONCLUSIVE


def verdict(comparisons: list[Comparison], want: str, unit: str = "nats") -> tuple[str, str]:
    """Aggregate comparisons that a claim predicts all come out `want` (A_LOWER or A_HIGHER).

    supported: every one is real, settled and in the predicted direction. contradicted: one is
    real and settled in the opposite direction. not run: none. Otherwise inconclusive, saying
    why and which effects the data excludes."""
    comparisons = [c for c in comparisons if c.n > 0]
    if not comparisons:
        return NOT_RUN, "no arms to compare"
    outcomes = [outcome(c, want) for c in comparisons]
    held = " (rankings held over the last quarter of training)" if any(c.settled for c in comparisons) else ""
    if CONTRADICTED in outcomes:
        k = outcomes.count(CONTRADICTED)
        return CONTRADICTED, f"{k} of {len(comparisons)} difference(s) real in the opposite direction{held}"
    if all(o == SUPPORTED for o in outcomes):
        return SUPPORTED, f"every difference exceeds its seed spread in the predicted direction{held}"
    why = []
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

