"""Paired comparisons between arms: the one rule every verdict in the report goes through.

At CPU scale arms differ by a few hundredths of a nat and one seed to another can differ by
more, so two arms are compared on the seeds they share (same init noise, same data order):
d_s = value_A(s) - value_B(s). The difference is called real only when the 95% t-interval of
mean(d_s) excludes 0. One shared seed decides nothing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from .load import SEED_COLS

ONE_SEED = "one seed"
WITHIN = "within spread"
A_LOWER = "A lower"
A_HIGHER = "A higher"
# With this many seed pairs a difference still inside its spread counts against a claim;
# with fewer it only means the data cannot tell.
POWERED_PAIRS = 5


@dataclass
class Comparison:
    n: int  # seed pairs (or, unpaired, the smaller arm's trials)
    mean_a: float
    mean_b: float
    diff: float  # mean of value_A - value_B
    lo: float  # 95% interval of diff
    hi: float
    paired: bool
    status: str  # ONE_SEED | WITHIN | A_LOWER | A_HIGHER

    def as_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}

    def text(self, unit: str = "nats") -> str:
        if self.n == 0:
            return "no trials to compare"
        if self.status == ONE_SEED:
            return f"{self.diff:+.4f} {unit} (one seed: no interval)"
        kind = "paired" if self.paired else "unpaired"
        return f"{self.diff:+.4f} {unit} [{self.lo:+.4f}, {self.hi:+.4f}] ({kind}, n={self.n})"


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


def compare(a: pd.DataFrame, b: pd.DataFrame, value: str, pair_cols=SEED_COLS) -> Comparison:
    """value(A) - value(B), paired on the seeds both have; unpaired (Welch) if they share none."""
    a = a[np.isfinite(a[value].astype(float))]
    b = b[np.isfinite(b[value].astype(float))]
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


def verdict(comparisons: list[Comparison], want: str) -> tuple[str, str]:
    """Aggregate comparisons that a claim predicts all come out `want` (A_LOWER or A_HIGHER).

    supported: every one is real in the predicted direction. not supported: one is real the
    other way, or (with >= POWERED_PAIRS seeds) stays inside its spread. Otherwise not enough
    data, saying why."""
    if not comparisons:
        return "not enough data", "no arms to compare"
    against = A_HIGHER if want == A_LOWER else A_LOWER
    if any(c.status == against for c in comparisons):
        return "not supported", "a difference is real in the opposite direction"
    if all(c.status == want for c in comparisons):
        return "supported", "every difference exceeds its seed spread in the predicted direction"
    if all(c.status == ONE_SEED for c in comparisons):
        return "not enough data", "one seed"
    weak = [c for c in comparisons if c.status in (WITHIN, ONE_SEED)]
    if all(c.n >= POWERED_PAIRS for c in weak if c.status == WITHIN) and not any(c.status == ONE_SEED for c in weak):
        return "not supported", f"no difference beyond the seed spread (n >= {POWERED_PAIRS} seeds)"
    if any(c.status == ONE_SEED for c in weak):
        return "not enough data", "one seed for some comparisons, and the rest not all real"
    return "not enough data", f"difference within the seed spread (n = {min(c.n for c in weak)} seeds)"
