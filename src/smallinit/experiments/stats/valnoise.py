"""Validation-sampling error of a paired loss comparison, measured beside the seed spread.

Every trial of a record is scored on the same validation tokens (train.eval_tokens from the
start of val), so the seeds share one validation sample: the paired t-interval over seeds sees
how the difference moves from seed to seed, not how it would move on other validation text.
The per-token losses (per_token_losses.npz: train.per_token_eval_tokens tokens from the same
start, cut into the same windows) measure that. A window of seq_len tokens is the unit: tokens
inside one window share a context and are correlated, windows much less so.

For a contrast (A - B, or an interaction) with per-pair differences d_i of the compared loss
and per-pair, per-window differences e_iw from the per-token losses:

    val_se   sd over windows of mean_i e_iw, / sqrt(W): the SE of the mean paired difference
             over validation windows. W = train.eval_tokens // seq_len, the windows the compared
             loss averages; the window sd is estimated on every per-token window.
    seed_se  sd_i(d_i) / sqrt(n): the seed spread behind the t-interval.
    ci_boot  95% percentile interval of a two-level bootstrap: each draw resamples the n pairs
             and W windows with replacement; the windows drawn are the same for every pair and
             both arms (all trials share the validation set, so the window draw is shared too),
             and move each pair's d_i by the drawn windows' mean e_iw minus all windows' mean.

Resampling both crossed factors counts the seed-by-window noise twice, so ci_boot errs wide
(Owen 2007, "the pigeonhole bootstrap"). With 3-4 pairs a percentile bootstrap over seeds is
narrower than the t-interval (it cannot see past the pairs it has): verdicts stay on the
t-interval; ci_boot says how much validation sampling would add.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from smallinit.core.trial_dir import TrialDir
from smallinit.experiments.data.trial_files import read_per_token

N_BOOT = 2000
BOOT_SEED = 0
# Validation sampling is "small" next to the seed spread at val_se / seed_se <= 1/3: the two
# add in quadrature, so the combined SE is then at most sqrt(1 + 1/9) - 1 = 5% above seed_se.
SMALL_RATIO = 1 / 3


@dataclass
class ValNoise:
    val_se: float
    seed_se: float
    ratio: float  # val_se / seed_se (inf when the seeds agree exactly)
    ci_boot: list[float]  # [lo, hi]
    windows: int  # W: the validation windows the compared loss averages


def window_means(loss, seq_len: int) -> np.ndarray:
    """(W,) mean loss of each consecutive window of seq_len tokens (the trainer's eval windows)."""
    loss = np.asarray(loss, dtype=float)
    w = len(loss) // seq_len
    if w < 1:
        raise ValueError(f"per-token losses: {len(loss)} tokens is not one window of seq_len={seq_len}")
    return loss[: w * seq_len].reshape(w, seq_len).mean(axis=1)


def val_se(e: np.ndarray, windows: int | None = None) -> float:
    """SE over validation windows of the mean paired difference. e: (n pairs, W windows)."""
    per_window = np.asarray(e, dtype=float).mean(axis=0)
    if len(per_window) < 2:
        return float("nan")
    return float(per_window.std(ddof=1) / math.sqrt(windows or len(per_window)))


def seed_se(d) -> float:
    d = np.asarray(d, dtype=float)
    return float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) >= 2 else float("nan")


def bootstrap(d, e, windows: int | None = None, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> tuple[float, float]:
    """95% percentile interval of mean(d) with seed pairs and validation windows resampled (module
    docstring). d: (n,) per-pair differences; e: (n, W) their per-window differences."""
    d, e = np.asarray(d, dtype=float), np.asarray(e, dtype=float)
    n, w = e.shape
    m = windows or w
    rng = np.random.default_rng(seed)
    pairs = rng.integers(0, n, size=(n_boot, n))
    counts = rng.multinomial(m, np.full(w, 1.0 / w), size=n_boot)  # (B, W): one window draw per replicate
    shift = counts @ (e - e.mean(axis=1, keepdims=True)).T / m  # (B, n): each pair's move under that draw
    means = np.take_along_axis(d[None, :] + shift, pairs, axis=1).mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def measure(d, e, windows: int | None = None, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> ValNoise:
    """Both SEs, their ratio and the two-level bootstrap interval; needs >= 2 pairs and windows."""
    d, e = np.asarray(d, dtype=float), np.asarray(e, dtype=float)
    if e.ndim != 2 or e.shape[0] != len(d) or len(d) < 2 or e.shape[1] < 2:
        raise ValueError(f"valnoise: d of shape {d.shape} and e of shape {e.shape}: need e (n, W) with n = len(d) >= 2, W >= 2")
    v, s = val_se(e, windows), seed_se(d)
    ratio = v / s if s > 0 else float("inf")
    return ValNoise(v, s, ratio, list(bootstrap(d, e, windows, n_boot, seed)), int(windows or e.shape[1]))


# --- reading a comparison's per-token files --------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def _trial_windows(path: str) -> tuple[str, np.ndarray, int] | None:
    """(digest of the target tokens, window means, windows of the compared loss) of one trial's
    per-token file; None where the file or its trial.json (seq_len, eval_tokens) is missing."""
    pt = read_per_token(path)
    record = TrialDir(Path(path).parent).read_trial(damaged_ok=True)  # damaged or odd: no windows, as missing
    cfg = record.get("config") if isinstance(record, dict) else None
    train = cfg.get("train") if isinstance(cfg, dict) else None
    if pt is None or not isinstance(train, dict):
        return None
    seq_len, eval_tokens = train.get("seq_len"), train.get("eval_tokens")
    if not seq_len:
        return None
    targets, loss = pt
    means = window_means(loss, seq_len)
    windows = eval_tokens // seq_len if eval_tokens else len(means)
    return hashlib.sha1(np.ascontiguousarray(targets).tobytes()).hexdigest(), means, windows


def _pair_windows(frame: pd.DataFrame, cols: list[str], keys) -> list | None:
    """Per pair key: (digest, mean window losses over the frame's trials with that key, windows)."""
    index, out = frame.set_index(cols).index, []
    for key in keys:
        paths = frame.loc[index.isin([key]), "per_token_losses_path"] if "per_token_losses_path" in frame else []
        read = [_trial_windows(p) if isinstance(p, str) else None for p in paths]
        if not read or any(r is None for r in read) or len({(r[0], len(r[1]), r[2]) for r in read}) != 1:
            return None
        out.append((read[0][0], np.mean([r[1] for r in read], axis=0), read[0][2]))
    return out


def for_contrast(frames, weights, value: str, pair_cols) -> ValNoise | None:
    """The contrast sum_k weights[k] * frames[k] per shared seed pair, measured; None where a
    trial of a shared pair has no per-token losses (older records), the files score different
    tokens, or fewer than 2 pairs are shared."""
    cols = list(pair_cols)
    means = [f.groupby(cols)[value].mean() for f in frames]
    shared = means[0].index
    for m in means[1:]:
        shared = shared.intersection(m.index)
    if len(shared) < 2:
        return None
    windows = [_pair_windows(f, cols, shared) for f in frames]
    if any(w is None for w in windows):
        return None
    cells = [cell for w in windows for cell in w]
    if len({(c[0], len(c[1]), c[2]) for c in cells}) != 1:  # one validation sample, one compared size
        return None
    d = sum(wt * m.loc[shared].to_numpy(float) for wt, m in zip(weights, means))
    e = sum(wt * np.stack([cell[1] for cell in w]) for wt, w in zip(weights, windows))
    return measure(d, e, cells[0][2])


# --- the record's sentence -----------------------------------------------------------------------

def record_sentence(numbers: list[dict]) -> str | None:
    """One sentence on validation-sampling SE against seed SE over a record's comparisons (the
    claims' `numbers`); None where no comparison measured it (records without per-token losses)."""
    seen, rows = set(), []
    for r in numbers:
        if r.get("val_se") is None or r.get("seed_se") is None:
            continue
        key = (r.get("label"), r.get("diff"))  # one comparison may back several claims
        if key not in seen:
            seen.add(key)
            rows.append(r)
    if not rows:
        return None
    vs, ss = [r["val_se"] for r in rows], [r["seed_se"] for r in rows]
    ratios = [r["val_se"] / r["seed_se"] if r["seed_se"] > 0 else float("inf") for r in rows]
    big = sum(x > SMALL_RATIO for x in ratios)
    windows = sorted({int(r["val_windows"]) for r in rows if r.get("val_windows")})
    span = lambda xs: f"{min(xs):.4f}" if f"{min(xs):.4f}" == f"{max(xs):.4f}" else f"{min(xs):.4f}–{max(xs):.4f}"  # noqa: E731
    head = (f"Validation sampling: over {len(rows)} loss comparison(s) the validation-sampling SE of the paired "
            f"difference ({'/'.join(map(str, windows))} windows) is {span(vs)} nats against a seed SE of {span(ss)}, "
            f"a ratio of at most {_ratio(max(ratios))}")
    if not big:
        return head + ", so it is small next to the seed spread (ratio ≤ 1/3 adds ≤ 5% to the combined SE)."
    return (head + f": not small next to the seed spread in {big} of {len(rows)} (ratio > 1/3), whose bootstrap "
            "interval over seeds and windows (ci_boot) includes it; more validation tokens (train.eval_tokens) shrink it.")


def _ratio(x: float) -> str:
    return "∞ (the seeds agree exactly)" if not math.isfinite(x) else f"{x:.2f}"
