"""The statistics of one set of paired differences d_s = A(s) - B(s) over shared seeds: the
95% t-interval of their mean, the paired t-test's one-sided p-values, an exact sign-flip p (no
normality assumed), and Holm's adjustment for a claim's several comparisons. stats.py builds
every verdict on these; a claim that rests on one set of per-seed values (a fitted slope) takes
them whole from `one_comparison`."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

# Up to this many pairs the sign-flip p enumerates all 2^n flips; above, it samples them.
SIGNFLIP_EXACT_MAX = 16
SIGNFLIP_DRAWS = 200_000


def t_interval(d: np.ndarray) -> tuple[float, float, float]:
    d = np.asarray(d, dtype=float)
    m = float(d.mean())
    if len(d) < 2:
        return m, float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return m, m - half, m + half


def t_pvalues(d) -> tuple[float, float]:
    """The paired t-test's one-sided p-values (for mean < 0, for mean > 0); nan with < 2 pairs.
    Their smaller one is below 0.025 exactly when the 95% t-interval excludes 0 on that side."""
    d = np.asarray(d, dtype=float)
    if len(d) < 2:
        return float("nan"), float("nan")
    m, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0:
        return (0.0, 1.0) if m < 0 else (1.0, 0.0) if m > 0 else (1.0, 1.0)
    t = m / (sd / math.sqrt(len(d)))
    return float(stats.t.cdf(t, len(d) - 1)), float(stats.t.sf(t, len(d) - 1))


def signflip_p(d, alternative: str = "two-sided") -> float:
    """Exact permutation p of the paired differences' mean over all 2^n sign flips (under the
    null each difference is as likely to have either sign). `alternative`: "two-sided", "less"
    (mean < 0) or "greater". Ties with the observed mean count as at least as extreme. Above
    SIGNFLIP_EXACT_MAX pairs the flips are sampled (seeded): (1 + hits) / (1 + draws)."""
    if alternative not in ("two-sided", "less", "greater"):
        raise ValueError(f"alternative={alternative!r} is invalid: must be two-sided, less or greater")
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n == 0:
        return float("nan")
    if n <= SIGNFLIP_EXACT_MAX:
        bits = (np.arange(2**n)[:, None] >> np.arange(n)) & 1  # (2^n, n): every sign pattern once
        signs = 1 - 2 * bits
    else:
        signs = np.random.default_rng(0).choice([-1, 1], size=(SIGNFLIP_DRAWS, n))
    sums, obs = signs @ d, float(d.sum())
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))  # float sums of the same terms in another order
    if alternative == "two-sided":
        hits = np.abs(sums) >= abs(obs) - tol
    elif alternative == "less":
        hits = sums <= obs + tol
    else:
        hits = sums >= obs - tol
    if n <= SIGNFLIP_EXACT_MAX:
        return float(hits.mean())
    return float((1 + hits.sum()) / (1 + len(sums)))


def holm(pvalues) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: the k-th smallest of m is
    multiplied by (m - k + 1), made non-decreasing along that order and capped at 1. Calling a
    hypothesis false where its adjusted p <= alpha keeps the family-wise error at most alpha."""
    p = np.asarray(pvalues, dtype=float)
    bad = [x for x in p if not 0 <= x <= 1]
    if bad:
        raise ValueError(f"holm: p-value {float(bad[0])!r} is invalid: each must be in [0, 1]")
    adjusted, running = np.empty(len(p)), 0.0
    for k, i in enumerate(np.argsort(p, kind="stable")):
        running = max(running, min(1.0, (len(p) - k) * float(p[i])))
        adjusted[i] = running
    return adjusted.tolist()


def one_comparison(d, predicted: str) -> dict:
    """The p-values a record keeps for a claim that rests on one set of per-seed values d (e.g. the
    slope of a fit, one per seed): both one-sided t p's, the two-sided sign-flip p, and p_against,
    the one-sided p against the `predicted` direction ("less": d < 0, or "greater"). With one
    comparison in the claim's family Holm leaves p_against as it is: p_holm = p_against."""
    if predicted not in ("less", "greater"):
        raise ValueError(f"predicted={predicted!r} is invalid: must be less or greater")
    lower, higher = t_pvalues(d)
    against = higher if predicted == "less" else lower
    return dict(n_confirm=len(np.asarray(d)), p_lower=lower, p_higher=higher, p_signflip=signflip_p(d),
                p_against=against, p_holm=against)
