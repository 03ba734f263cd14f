"""The statistics of one set of paired differences d_s = A(s) - B(s) over shared seeds: the
95% t-interval of their mean, the paired t-test's one-sided p-values, an exact sign-flip p (no
normality assumed), and Holm's adjustment for a claim's several comparisons. stats.py builds
every verdict on these; a claim that rests on one set of per-seed values (a fitted slope) takes
them whole from `one_comparison`."""

from __future__ import annotations

import numpy as np
from scipy import stats

# Up to this many pairs the sign-flip p enumerates all 2^n flips; above, it samples them.
SIGNFLIP_EXACT_MAX = 16
SIGNFLIP_DRAWS = 200_000


def t_interval(d: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high): the 95% t-interval of the mean (scipy's ttest_1samp); nan bounds with
    one pair, a zero-width interval where every difference is the same."""
    d = np.asarray(d, dtype=float)
    m = float(d.mean())
    if len(d) < 2:
        return m, float("nan"), float("nan")
    if float(d.std(ddof=1)) == 0:
        return m, m, m
    ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
    return m, float(ci.low), float(ci.high)


def t_pvalues(d) -> tuple[float, float]:
    """The paired t-test's one-sided p-values (for mean < 0, for mean > 0); nan with < 2 pairs.
    Their smaller one is below 0.025 exactly when the 95% t-interval excludes 0 on that side."""
    d = np.asarray(d, dtype=float)
    if len(d) < 2:
        return float("nan"), float("nan")
    m, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0:  # scipy's t is then inf or nan: the sign of the mean decides
        return (0.0, 1.0) if m < 0 else (1.0, 0.0) if m > 0 else (1.0, 1.0)
    return (float(stats.ttest_1samp(d, 0.0, alternative="less").pvalue),
            float(stats.ttest_1samp(d, 0.0, alternative="greater").pvalue))


def signflip_p(d, alternative: str = "two-sided") -> float:
    """Exact permutation p of the paired differences' mean over all 2^n sign flips (under the
    null each difference is as likely to have either sign): scipy's permutation_test with
    permutation_type="samples" on the one sample. `alternative`: "two-sided", "less" (mean < 0)
    or "greater". Ties with the observed mean count as at least as extreme. Above
    SIGNFLIP_EXACT_MAX pairs the flips are sampled (seeded): (1 + hits) / (1 + draws)."""
    if alternative not in ("two-sided", "less", "greater"):
        raise ValueError(f"alternative={alternative!r} is invalid: must be two-sided, less or greater")
    d = np.asarray(d, dtype=float)
    if len(d) == 0:
        return float("nan")
    if len(d) == 1:  # scipy wants two observations; the two flips of one are written out
        x = float(d[0])
        return 1.0 if alternative == "two-sided" or x == 0 else 0.5 if (x < 0) == (alternative == "less") else 1.0
    exact = len(d) <= SIGNFLIP_EXACT_MAX
    result = stats.permutation_test((d,), lambda x, axis: np.mean(x, axis=axis), vectorized=True,
                                    permutation_type="samples", alternative=alternative,
                                    n_resamples=np.inf if exact else SIGNFLIP_DRAWS, rng=0)
    return float(result.pvalue)


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
