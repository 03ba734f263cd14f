"""The paired gap A - B over training, at every evaluation both sides logged, and whether a
ranking settled: a comparison counts only if the sign of its gap held over the last quarter of
training (SETTLE_FRACTION), since a ranking read while the gap still moves ranks learning speed,
not end points."""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

from smallinit.experiments.data.load import SEED_COLS
from smallinit.experiments.data.trial_files import read_metrics

from .paired import t_interval

# The ranking must hold over this last fraction of training to count.
SETTLE_FRACTION = 0.25


def pair_curves(frame: pd.DataFrame, key: str, pair_cols) -> pd.DataFrame:
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
    return contrast_over_training([a, b], (1, -1), key, pair_cols)


def contrast_over_training(frames: list[pd.DataFrame], signs: tuple[int, ...], key: str,
                           pair_cols=SEED_COLS) -> list[dict] | None:
    """sum(sign * frame's curve) per seed pair at every evaluation all frames logged (A - B is
    signs (1, -1); an interaction (A1 - B1) - (A0 - B0) is (1, -1, -1, 1)), with its 95% interval."""
    curves = [pair_curves(f, key, list(pair_cols)) for f in frames]
    if any(len(c) == 0 for c in curves):
        return None
    joined = pd.concat(dict(enumerate(curves)), axis=1).dropna()
    out = []
    for step, g in joined.groupby(level="step"):
        m, lo, hi = t_interval(sum(sign * g[i] for i, sign in enumerate(signs)).to_numpy())
        out.append(dict(step=int(step), n=len(g), diff=m, lo=lo if math.isfinite(lo) else None,
                        hi=hi if math.isfinite(hi) else None))
    return out or None


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
