"""Effective model size over (width, token budget), and where small init starts to pay.

Pure: results rows in (one per (trial, budget): d_model, n_layers, n_params, budget_tokens,
init_seed/train_seed or seed, final_val_loss), dataclasses and summary.json blocks out.

The fit (Hoffmann et al. 2022, approach 3): L(N, D) = E + A N^-alpha + B D^-beta over the
baseline's (width, budget) cells (seed means); N = non-embedding parameters (Kaplan et al. 2020:
all but the token embedding and the LM head). Huber loss (delta 1e-3) on log L, L-BFGS in
log-parameter space (E = e^e, A = e^a, B = e^b) from the best points of a start grid; N and D
are divided by their geometric means inside the fit so a and b sit near 0. A fit on total N
(n_params) is reported beside it, point estimates only.

Effective size: at a recipe cell (N, D, loss L_r) the baseline at the same D reaches L_r at
N_eff = (A / (L_r - E - B D^-beta))^(1/alpha); n_eff_ratio = N_eff / N with the recipe's own N
(a gate's parameters count against it). No width reaches L_r when L_r <= E + B D^-beta.

Compute multiplier = C_baseline(N_eff, D) / C_recipe(N, D), both at the recipe's D, with compute
per token F = 6 (N + d V) + 12 L d T: the PaLM/Chinchilla count (every matmul including the
LM head, both attention matmuls over the full context T, backward = 2x forward; Kaplan's
6N + 6 L T d counts one attention matmul). Not on the baseline's compute-optimal frontier: CPU
cells sit at 0.1-1.5 tokens per parameter against Chinchilla's ~20, so the frontier would be
read off the fit far outside the measured (N, D), and would credit the recipe with its cell's
distance from the frontier. The baseline's width at N_eff comes from ln d = u + v ln N over its
cells (a fixed-depth family); with the head and attention counted the multiplier of a 2x N_eff
is below 2 wherever d V is not small against N.

Intervals: seed bootstrap (seeds resampled within each cell, the same draw for both arms where
they share seeds, the spread of each resampled mean widened by sqrt(n/(n-1)); the fit redone),
95% percentile. They cover less than 95%: on 12 synthetic sweeps of 6 seeds (4 widths x 3
budgets, 0.003 nats of seed noise) N_eff/N's interval held the truth in 128 of 144 cells (89%);
fewer seeds do worse (a t with 3 degrees of freedom is wider than any bootstrap of 4 values). Degenerate only when alpha or beta <= 0 or an
interval is unbounded; `reasons` says which. Each cell also keeps the bootstrap's one-sided p
on each side of N_eff/N = 1, (1 + resamples on that side) / (1 + resamples), so that a verdict
over several cells can correct for their number (Holm); below 1 / (1 + n_boot) it cannot go.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize

from smallinit.core import results_schema as schema
from smallinit.core.flops import training_flops_per_token

try:  # L-BFGS-B's 5-parameter steps call OpenBLAS, whose threads spin against each other on a
    # busy 2-core machine (2.3 s against 0.18 s per start, measured); one thread is plenty.
    from threadpoolctl import threadpool_limits
except ImportError:  # not a declared dependency: without it the fit is only slower
    threadpool_limits = None
_limited = False  # entering the limit costs ~10 ms: once per effective_size, not per refit


@contextlib.contextmanager
def _one_blas_thread():
    global _limited
    if threadpool_limits is None or _limited:
        yield
        return
    _limited = True
    try:
        with threadpool_limits(1):
            yield
    finally:
        _limited = False


BUDGET = "budget_tokens"
LOSS = schema.FINAL_VAL_LOSS
HUBER_DELTA = 1e-3
N_BOOT = 200
# Starts in the scaled log-parameter space; L-BFGS runs from the N_STARTS best of them.
GRID = ((-1.0, 0.0, 0.5, 1.0, 1.5), (-4.0, -2.5, -1.0, 0.5), (-4.0, -2.5, -1.0, 0.5),
        (0.0, 0.25, 0.5, 1.0, 1.5), (0.0, 0.25, 0.5, 1.0, 1.5))  # e, a, b, alpha, beta
N_STARTS = 8
MIN_CELLS = 6


def json_float(v) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None


def non_embedding_params(n_params, d_model, vocab_size: int, tie_embeddings: bool = False):
    """Parameters less the token embedding and the LM head (one matrix when they are tied)."""
    return n_params - vocab_size * np.asarray(d_model) * (1 if tie_embeddings else 2)


def flops_per_token(n_nonembed, d_model, n_layers, seq_len: int, vocab_size: int):
    """Training FLOPs per token (core.flops) from the table's columns: the matmul parameters are
    the non-embedding ones plus the LM head (d V)."""
    return training_flops_per_token(np.asarray(n_nonembed) + np.asarray(d_model) * vocab_size, n_layers, d_model, seq_len)


def _terms(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(3, ..., n) log-terms of L for theta (..., 5) at scaled log N = x, log D = y."""
    e, a, b, al, be = (theta[..., i, None] for i in range(5))
    return np.stack(np.broadcast_arrays(e + 0 * x, a - al * x, b - be * y))


def _huber(r: np.ndarray) -> np.ndarray:  # divided by delta so its gradient is O(1)
    return np.where(np.abs(r) <= HUBER_DELTA, r**2 / (2 * HUBER_DELTA), np.abs(r) - HUBER_DELTA / 2)


def _objective(theta, x, y, log_l):
    """Huber(log L_fit - log L) summed, and its gradient in theta."""
    e, a, b, al, be = theta
    t1, t2 = a - al * x, b - be * y
    top = np.maximum(np.maximum(t1, t2), e)
    w0, w1, w2 = np.exp(e - top), np.exp(t1 - top), np.exp(t2 - top)
    total = w0 + w1 + w2
    r = top + np.log(total) - log_l
    h = np.clip(r, -HUBER_DELTA, HUBER_DELTA) / (HUBER_DELTA * total)
    g1, g2 = h * w1, h * w2
    grad = np.array([(h * w0).sum(), g1.sum(), g2.sum(), -(g1 * x).sum(), -(g2 * y).sum()])
    return float(_huber(r).sum()), grad


def _exp(x: float) -> float:
    return math.exp(x) if x < 709.0 else math.inf


@dataclass(frozen=True)
class Law:
    """L = E + A N^-alpha + B D^-beta; theta = (e, a, b, alpha, beta) with N/n_ref, D/d_ref."""

    theta: tuple[float, ...]
    n_ref: float
    d_ref: float
    objective: float

    E = property(lambda s: math.exp(s.theta[0]))
    alpha = property(lambda s: s.theta[3])
    beta = property(lambda s: s.theta[4])
    # In log space: a degenerate fit on a few cells (alpha ~ 60) makes A past any float, which is
    # then inf (and printed so) rather than an OverflowError that stops the whole report.
    A = property(lambda s: _exp(s.theta[1] + s.theta[3] * math.log(s.n_ref)))
    B = property(lambda s: _exp(s.theta[2] + s.theta[4] * math.log(s.d_ref)))

    def loss(self, n, d):
        e, a, b, al, be = self.theta
        return math.exp(e) + math.exp(a) * (np.asarray(n) / self.n_ref) ** -al + math.exp(b) * (np.asarray(d) / self.d_ref) ** -be

    def n_at(self, loss: float, d: float) -> float:
        """The N at which the law at budget d reaches `loss`; inf where none does."""
        e, a, b, al, be = self.theta
        rest = loss - math.exp(e) - math.exp(b) * (d / self.d_ref) ** -be
        return self.n_ref * (math.exp(a) / rest) ** (1 / al) if rest > 0 and al > 0 else math.inf

    def params(self) -> dict:
        return dict(E=self.E, A=self.A, alpha=self.alpha, B=self.B, beta=self.beta, huber=self.objective)


_GRID = np.array(list(itertools.product(*GRID)))


def fit_law(n, d, loss, starts=(), n_starts: int = N_STARTS) -> Law:
    """Approach 3 over points (n_i, d_i, loss_i): L-BFGS from the n_starts best grid points and
    from `starts` (thetas), the lowest Huber loss kept."""
    n, d, loss = (np.asarray(v, dtype=float) for v in (n, d, loss))
    if len(loss) < 5:
        raise ValueError(f"L(N, D) has 5 parameters: needs >= 5 points, got {len(loss)}")
    n_ref, d_ref = float(np.exp(np.log(n).mean())), float(np.exp(np.log(d).mean()))
    x, y, log_l = np.log(n / n_ref), np.log(d / d_ref), np.log(loss)
    t = _terms(_GRID, x, y)
    top = t.max(0)
    grid_obj = _huber(top + np.log(np.exp(t - top).sum(0)) - log_l).sum(-1)
    best = None
    with _one_blas_thread():
        for start in [*_GRID[np.argsort(grid_obj)[:n_starts]], *starts]:
            res = optimize.minimize(_objective, start, args=(x, y, log_l), jac=True, method="L-BFGS-B",
                                    options=dict(maxiter=1000, gtol=1e-9, ftol=1e-13))
            if np.all(np.isfinite(res.x)) and (best is None or res.fun < best.fun):
                best = res
    return Law(tuple(float(v) for v in best.x), n_ref, d_ref, float(best.fun))


@dataclass
class Cell:
    d_model: int
    n_layers: int
    budget_tokens: float
    n_nonembed: float
    loss: float
    seeds: int
    n_eff_ratio: float = math.nan
    n_eff_ratio_ci: tuple[float, float] = (math.nan, math.nan)
    compute_multiplier: float = math.nan
    compute_multiplier_ci: tuple[float, float] = (math.nan, math.nan)
    n_eff_ratio_total: float = math.nan  # on the total-N fit, no interval
    # Bootstrap p-values: the share of resamples with N_eff/N >= 1 (p against "smaller") and <= 1
    # (p against "larger"); nan without a bootstrap.
    p_not_smaller: float = math.nan
    p_not_larger: float = math.nan


@dataclass
class EffectiveSize:
    status: str  # "fit", "degenerate", or why there is no fit
    reasons: list[str] = field(default_factory=list)
    fit: Law | None = None
    fit_total: Law | None = None
    cells: list[Cell] = field(default_factory=list)
    baseline_cells: int = 0
    n_boot: int = 0


def seed_key(df: pd.DataFrame) -> pd.Series:
    if "seed" in df:
        return df["seed"].astype(str)
    for col in ("init_seed", "train_seed"):
        if col not in df:
            raise ValueError(f"results have no column {col!r} (or 'seed'): seeds are needed for intervals")
    return df["init_seed"].astype(int).astype(str) + "/" + df["train_seed"].astype(int).astype(str)


def cell_seeds(df: pd.DataFrame, metric: str = LOSS) -> dict[tuple, pd.Series]:
    """(d_model, n_layers, budget_tokens) -> the cell's loss per seed (mean over repeats)."""
    for col in ("d_model", "n_layers", BUDGET, metric):
        if col not in df:
            raise ValueError(f"results have no column {col!r}: needed for one row per (trial, budget)")
    df = df.assign(_seed=seed_key(df))
    return {(int(k[0]), int(k[1]), float(k[2])): g.groupby("_seed")[metric].mean()
            for k, g in df.groupby(["d_model", "n_layers", BUDGET])}


def _shape(df, vocab_size, tie_embeddings) -> dict[tuple, tuple[float, float]]:
    """(d_model, n_layers, budget) -> (non-embedding N, total N), means over the cell's rows."""
    if "n_params" not in df:
        raise ValueError("results have no column 'n_params': needed to count N")
    out = {}
    for k, g in df.groupby(["d_model", "n_layers", BUDGET]):
        total = float(g["n_params"].mean())
        out[(int(k[0]), int(k[1]), float(k[2]))] = (float(non_embedding_params(total, k[0], vocab_size, tie_embeddings)), total)
    return out


def effective_size(baseline: pd.DataFrame, recipe: pd.DataFrame, *, vocab_size: int, seq_len: int,
                   tie_embeddings: bool = False, metric: str = LOSS, n_boot: int = N_BOOT, seed: int = 0) -> EffectiveSize:
    """Fit the baseline's L(N, D) and read each recipe cell's N_eff/N and compute multiplier.
    baseline, recipe: the two arms' rows; vocab_size, seq_len: the trials' (for N and FLOPs)."""
    with _one_blas_thread():
        return _effective_size(baseline, recipe, vocab_size, seq_len, tie_embeddings, metric, n_boot, seed)


def _effective_size(baseline, recipe, vocab_size, seq_len, tie_embeddings, metric, n_boot, seed) -> EffectiveSize:
    base, rec = cell_seeds(baseline, metric), cell_seeds(recipe, metric)
    base_n, rec_n = _shape(baseline, vocab_size, tie_embeddings), _shape(recipe, vocab_size, tie_embeddings)
    keys = sorted(base)
    widths, budgets = {k[0] for k in keys}, {k[2] for k in keys}
    if len(widths) < 2 or len(budgets) < 2 or len(keys) < MIN_CELLS:
        return EffectiveSize(f"needs the baseline at >= 2 widths and >= 2 budgets (>= {MIN_CELLS} cells) to fit "
                             f"L(N, D); have {len(widths)} widths, {len(budgets)} budgets, {len(keys)} cells",
                             baseline_cells=len(keys))
    n_ne = np.array([base_n[k][0] for k in keys])
    n_tot = np.array([base_n[k][1] for k in keys])
    dd = np.array([k[2] for k in keys])
    fit = fit_law(n_ne, dd, [base[k].mean() for k in keys])
    fit_total = fit_law(n_tot, dd, [base[k].mean() for k in keys])
    # Width of a baseline model of N non-embedding parameters: ln d = u + v ln N over its cells.
    v, u = np.polyfit(np.log(n_ne), np.log([k[0] for k in keys]), 1)

    def multiplier(n_eff: float, k: tuple) -> float:
        if not math.isfinite(n_eff):
            return math.inf
        f_base = flops_per_token(n_eff, math.exp(u + v * math.log(n_eff)), k[1], seq_len, vocab_size)
        return float(f_base / flops_per_token(rec_n[k][0], k[0], k[1], seq_len, vocab_size))

    cells = []
    for k in sorted(rec):
        c = Cell(k[0], k[1], k[2], rec_n[k][0], float(rec[k].mean()), len(rec[k]))
        n_eff = fit.n_at(c.loss, k[2])
        c.n_eff_ratio, c.compute_multiplier = n_eff / c.n_nonembed, multiplier(n_eff, k)
        c.n_eff_ratio_total = fit_total.n_at(c.loss, k[2]) / rec_n[k][1]
        cells.append(c)
    out = EffectiveSize("fit", fit=fit, fit_total=fit_total, cells=cells, baseline_cells=len(keys), n_boot=n_boot)
    if cells and n_boot > 0:
        rng = np.random.default_rng(seed)
        reps = np.full((n_boot, len(cells), 2), np.nan)
        for r in range(n_boot):
            draws = {k: rng.choice(base[k].index, len(base[k])) for k in keys}
            boot = fit_law(n_ne, dd, [_resampled(base[k], draws[k]) for k in keys], [fit.theta], 1)
            for i, c in enumerate(cells):
                k, s = (c.d_model, c.n_layers, c.budget_tokens), rec[(c.d_model, c.n_layers, c.budget_tokens)]
                paired = k in draws and pd.Index(draws[k]).isin(s.index).all()
                loss = _resampled(s, draws[k] if paired else rng.choice(s.index, len(s)))
                n_eff = boot.n_at(loss, k[2])
                reps[r, i] = n_eff / c.n_nonembed, multiplier(n_eff, k)
        ci = _percentile_ci(reps)
        for i, c in enumerate(cells):
            c.n_eff_ratio_ci, c.compute_multiplier_ci = tuple(ci[i, 0]), tuple(ci[i, 1])
            c.p_not_smaller, c.p_not_larger = _bootstrap_p(reps[:, i, 0], 1.0)
    out.reasons = _degenerate(fit, cells)
    out.status = "degenerate" if out.reasons else "fit"
    return out


def _resampled(losses: pd.Series, seeds) -> float:
    """A cell's mean over resampled seeds, its spread widened by sqrt(n / (n - 1)): a bootstrap
    mean of n values varies (n - 1) / n as much as the mean does (25% too little at 4 seeds)."""
    n, m = len(losses), float(losses.mean())
    return m if n < 2 else m + math.sqrt(n / (n - 1)) * (float(losses.loc[seeds].mean()) - m)


def _bootstrap_p(reps: np.ndarray, at: float) -> tuple[float, float]:
    """(p that the value is not below `at`, p that it is not above), each (1 + hits) / (1 + n)
    over the finite-or-infinite resamples (nan ones, where a refit failed, left out)."""
    r = reps[~np.isnan(reps)]
    if len(r) == 0:
        return math.nan, math.nan
    return float((1 + (r >= at).sum()) / (1 + len(r))), float((1 + (r <= at).sum()) / (1 + len(r)))


def _percentile_ci(reps: np.ndarray) -> np.ndarray:
    """95% percentile interval over axis 0, inf kept (an unreachable loss is unbounded above)."""
    big = np.where(np.isinf(reps), 1e300, reps)
    ci = np.nanpercentile(big, [2.5, 97.5], axis=0)  # (2, cells, 2)
    return np.moveaxis(np.where(ci >= 1e299, math.inf, ci), 0, -1)  # (cells, 2, 2)


def _degenerate(fit: Law, cells: list[Cell]) -> list[str]:
    reasons = []
    if fit.alpha <= 0:
        reasons.append(f"alpha = {fit.alpha:.3g} <= 0: the baseline's loss does not fall with N at a fixed budget")
    if fit.beta <= 0:
        reasons.append(f"beta = {fit.beta:.3g} <= 0: the baseline's loss does not fall with tokens at a fixed N")
    for c in cells if fit.alpha > 0 else ():
        where = f"d={c.d_model}, D={c.budget_tokens:,.0f}"
        if not math.isfinite(c.n_eff_ratio):
            reasons.append(f"{where}: the recipe's loss {c.loss:.4f} is below the fit's floor at that budget "
                           f"(E + B D^-beta = {fit.loss(math.inf, c.budget_tokens):.4f}): no baseline width reaches it")
        elif any(math.isinf(v) for v in (*c.n_eff_ratio_ci, *c.compute_multiplier_ci)):  # nan: no bootstrap
            reasons.append(f"{where}: the interval of N_eff/N is unbounded above (in some resamples the "
                           "recipe's loss is below the refit's floor E + B D^-beta, or alpha <= 0)")
    return reasons
