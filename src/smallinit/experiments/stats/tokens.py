"""Token level: where on the eval tokens one variant beats another.

Every trial of a corpus scores the same fixed eval tokens in the same order
(per_token_losses.npz), so two variants compare token by token. For a token with true-token
probabilities p_A = exp(-loss_A) and p_B = exp(-loss_B):

    Delta_sym = (p_A - p_B) / (p_A + p_B) = tanh((loss_B - loss_A) / 2)   in (-1, 1)

positive where A gives the true token more probability. A token's difficulty is its mean loss
over the trials of that size other than A's and B's (all variants, all seeds; every trial when
fewer than two others exist); tokens are cut into quintiles of difficulty.
Per seed pair (A and B with the same seeds) the mean Delta_sym of each bucket is taken, then
averaged over pairs with a t-interval; with one pair the interval is over tokens (evaluation
noise only) and decides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from smallinit.experiments.data.load import SEED_COLS, Sweep
from smallinit.experiments.data.trial_files import read_per_token

from .stats import Comparison, from_diffs

N_BUCKETS = 5
BUCKET_NAMES = ("easiest", "easy", "moderate", "hard", "hardest")
# "Moderate-to-hard" = the top three quintiles of difficulty; "easy" = the bottom two.
HARD_FROM = 2


def delta_sym(loss_a, loss_b) -> np.ndarray:
    """(p_A - p_B) / (p_A + p_B) with p = exp(-loss), computed stably as tanh((l_B - l_A)/2)."""
    return np.tanh((np.asarray(loss_b, dtype=float) - np.asarray(loss_a, dtype=float)) / 2.0)


def difficulty_buckets(difficulty: np.ndarray, n: int = N_BUCKETS) -> tuple[np.ndarray, np.ndarray]:
    """Quantile buckets 0..n-1 of difficulty, and the n+1 edges (nats)."""
    edges = np.quantile(difficulty, np.linspace(0, 1, n + 1))
    bucket = np.clip(np.searchsorted(edges[1:-1], difficulty, side="right"), 0, n - 1)
    return bucket, edges


@dataclass
class TokenResult:
    size: str
    variant_a: str
    variant_b: str
    n_tokens: int
    n_trials_difficulty: int
    difficulty_from: str
    pairs: list[str]  # seed keys
    edges: np.ndarray
    buckets: pd.DataFrame  # bucket, name, lo, hi, mean, lo_ci, hi_ci, tokens
    overall: Comparison
    hard: Comparison  # mean Delta_sym on moderate-to-hard tokens
    hard_minus_easy: Comparison
    curve: pd.DataFrame = field(default_factory=pd.DataFrame)  # fine bins: difficulty, mean delta
    interval: str = ""


def _load_group(rows: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for _, r in rows.iterrows():
        pt = read_per_token(r.get("per_token_losses_path"))
        if pt is not None:
            out[r["identity"]] = pt
    return out


def analyse(sweep: Sweep, variant_a: str, variant_b: str, size: str, seed: int = 0) -> TokenResult | str:
    """Delta_sym of A against B at one size, or a sentence saying why it cannot be computed."""
    df = sweep.complete[sweep.complete["size"] == size]
    losses = _load_group(df)
    a, b = df[df["variant"] == variant_a], df[df["variant"] == variant_b]
    a = a[a["identity"].isin(losses)]
    b = b[b["identity"].isin(losses)]
    if a.empty or b.empty:
        return f"no per-token losses for both arms at {size}"
    ref_targets = losses[a["identity"].iloc[0]][0]
    same = {k: v for k, v in losses.items() if len(v[0]) == len(ref_targets) and np.array_equal(v[0], ref_targets)}
    a, b = a[a["identity"].isin(same)], b[b["identity"].isin(same)]
    if b.empty:
        return f"the two arms at {size} were scored on different eval tokens"
    # Difficulty from trials other than A's and B's where there are enough: measured on the
    # two compared variants it correlates with their gap by construction (a token one gets
    # badly wrong looks "hard"). Fewer than two others: all trials, with that caveat.
    others = [k for k in same if k not in set(a["identity"]) | set(b["identity"])]
    diff_ids = others if len(others) >= 2 else list(same)
    difficulty = np.mean([same[k][1] for k in diff_ids], axis=0)
    bucket, edges = difficulty_buckets(difficulty)
    ka = a.set_index(list(SEED_COLS))["identity"]
    kb = b.set_index(list(SEED_COLS))["identity"]
    shared = [k for k in ka.index.unique() if k in kb.index]
    if shared:
        pairs = [(same[_first(ka, k)][1], same[_first(kb, k)][1]) for k in shared]
        labels = [f"{k[0]}/{k[1]}" for k in shared]
    else:  # no common seeds: compare seed-averaged losses (unpaired, one "pair")
        pairs = [(np.mean([same[i][1] for i in a["identity"]], 0), np.mean([same[i][1] for i in b["identity"]], 0))]
        labels = ["seed means"]
    deltas = np.stack([delta_sym(la, lb) for la, lb in pairs])  # (pairs, tokens)
    hard = bucket >= HARD_FROM
    per_bucket = np.stack([deltas[:, bucket == i].mean(1) for i in range(N_BUCKETS)], 1)  # (pairs, buckets)
    rows = []
    if len(pairs) >= 2:
        interval = f"95% t-interval over {len(pairs)} seed pairs"
        for i in range(N_BUCKETS):
            c = from_diffs(per_bucket[:, i])
            rows.append((c.diff, c.lo, c.hi))
    else:
        interval = "95% bootstrap over tokens (one seed: evaluation noise only)"
        rng = np.random.default_rng(seed)
        d = deltas[0]
        for i in range(N_BUCKETS):
            x = d[bucket == i]
            boots = [x[rng.integers(0, len(x), len(x))].mean() for _ in range(300)]
            rows.append((x.mean(), *np.percentile(boots, [2.5, 97.5])))
    table = pd.DataFrame([
        dict(bucket=i + 1, name=BUCKET_NAMES[i], difficulty_lo=edges[i], difficulty_hi=edges[i + 1],
             tokens=int((bucket == i).sum()), mean_delta=m, ci_lo=lo, ci_hi=hi)
        for i, (m, lo, hi) in enumerate(rows)
    ])
    fine_bucket, fine_edges = difficulty_buckets(difficulty, 20)
    curve = pd.DataFrame(dict(
        difficulty=[difficulty[fine_bucket == i].mean() for i in range(20)],
        mean_delta=[deltas[:, fine_bucket == i].mean() for i in range(20)],
    ))
    return TokenResult(
        size=size, variant_a=variant_a, variant_b=variant_b, n_tokens=len(difficulty),
        n_trials_difficulty=len(diff_ids), pairs=labels, edges=edges, buckets=table,
        difficulty_from="trials other than A and B" if diff_ids is others else "all trials, A and B included",
        overall=from_diffs(deltas.mean(1)), hard=from_diffs(deltas[:, hard].mean(1)),
        hard_minus_easy=from_diffs(deltas[:, hard].mean(1) - deltas[:, ~hard].mean(1)),
        curve=curve, interval=interval,
    )


def _first(series: pd.Series, key) -> str:
    v = series.loc[key]
    return v.iloc[0] if isinstance(v, pd.Series) else v
