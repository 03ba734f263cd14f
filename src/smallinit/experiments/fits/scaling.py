"""Effective model size: how many parameters small init is worth.

Fit L(N) = E + A * N^-alpha to the baseline variant (gamma = 0.5 by default) over the sizes
present; a variant with loss L at size N then matches a baseline model of
N_eff = (A / (L - E))^(1/alpha) parameters, and its gain is N_eff / N - 1 (the paper reports
~+44% for gamma = 1 with eps = 1e-12 and the gate at 0.1B-1.5B). N is the total parameter
count in the results table. With fewer than three sizes there is nothing to fit.

The fit is variable projection: for a fixed alpha the model is linear in (E, A), so alpha is
searched on a grid, then refined; E >= 0 and A > 0 are enforced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize

from smallinit.experiments.data.load import LOSS, SEED_COLS, Sweep
from smallinit.experiments.data.trial_files import read_per_token

ALPHA_RANGE = (1e-3, 3.0)
N_BOOT = 500


@dataclass(frozen=True)
class PowerLaw:
    E: float
    A: float  # in the original units of N: L = E + A * N^-alpha
    alpha: float
    n_ref: float  # sizes are scaled by n_ref inside the fit (A_ref = A * n_ref^-alpha)
    sse: float

    @property
    def a_ref(self) -> float:
        return self.A * self.n_ref ** (-self.alpha)

    def loss(self, n) -> np.ndarray:
        return self.E + self.a_ref * (np.asarray(n, dtype=float) / self.n_ref) ** (-self.alpha)

    def n_eff(self, loss) -> np.ndarray:
        """(A / (L - E))^(1/alpha); inf where L <= E (better than any baseline size)."""
        gap = np.asarray(loss, dtype=float) - self.E
        with np.errstate(divide="ignore", invalid="ignore"):
            out = self.n_ref * (self.a_ref / gap) ** (1.0 / self.alpha)
        return np.where(gap > 0, out, np.inf)


def _solve_linear(z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least squares y ~ E + a z for each row of z (k, n): returns E, a, sse (each (k,)),
    with E >= 0 and a >= 0 enforced by falling back to the constrained solutions."""
    zm, ym = z.mean(1, keepdims=True), y.mean()
    zc = z - zm
    var = (zc**2).sum(1)
    a = np.where(var > 0, (zc * (y - ym)).sum(1) / np.where(var > 0, var, 1), 0.0)
    e = ym - a * zm[:, 0]
    bad = e < 0  # refit through the origin: y ~ a z
    a = np.where(bad, (z * y).sum(1) / (z**2).sum(1), a)
    e = np.where(bad, 0.0, e)
    neg = a < 0  # a flat line at the mean
    e = np.where(neg, max(ym, 0.0), e)
    a = np.where(neg, 0.0, a)
    sse = ((e[:, None] + a[:, None] * z - y) ** 2).sum(1)
    return e, a, sse


def fit_power_law(n, loss, grid: int = 300) -> PowerLaw:
    """L = E + A N^-alpha by least squares over the points (n_i, loss_i)."""
    n, y = np.asarray(n, dtype=float), np.asarray(loss, dtype=float)
    if len(n) < 3 or len(np.unique(n)) < 3:
        raise ValueError("a power law with an offset needs at least three distinct sizes")
    n_ref = float(np.exp(np.log(n).mean()))
    x = n / n_ref
    alphas = np.geomspace(*ALPHA_RANGE, grid)
    e, a, sse = _solve_linear(x[None, :] ** -alphas[:, None], y)
    i = int(np.argmin(sse))
    lo, hi = alphas[max(i - 1, 0)], alphas[min(i + 1, grid - 1)]

    def sse_at(alpha: float) -> float:
        return float(_solve_linear(x[None, :] ** -alpha, y)[2][0])

    best = optimize.minimize_scalar(sse_at, bounds=(lo, hi), method="bounded", options={"xatol": 1e-7})
    alpha = float(best.x) if best.fun <= sse[i] else float(alphas[i])
    e1, a1, s1 = (v[0] for v in _solve_linear(x[None, :] ** -alpha, y))
    return PowerLaw(E=float(e1), A=float(a1 * n_ref**alpha), alpha=alpha, n_ref=n_ref, sse=float(s1))


def _is(values: pd.Series, target: float) -> pd.Series:
    return np.isclose(values.astype(float), target, rtol=1e-6, atol=1e-9)


def baseline_mask(df: pd.DataFrame, gamma: float, setting: str) -> pd.Series:
    return _is(df["gamma"], gamma) & (df["setting"] == setting)


def choose_baseline_setting(df: pd.DataFrame, gamma: float, prefer: dict[str, str] | None = None) -> str | None:
    """The setting of the baseline: the user's choice, else the conventional one present at
    gamma (eps = 1e-5 or the largest eps, no gate, RMSNorm), else the most common."""
    at = df[_is(df["gamma"], gamma)]
    if at.empty:
        return None
    cand = at
    for col, want in (prefer or {}).items():
        if col not in cand:
            raise ValueError(f"--baseline key {col!r} is not a column of the results")
        sel = cand[cand[col].astype(str) == str(want)] if col != "eps" else cand[_is(cand[col], float(want))]
        if sel.empty:
            raise ValueError(f"--baseline {col}={want} matches no trial at gamma={gamma:g}")
        cand = sel
    if not prefer:
        eps_pick = 1e-5 if _is(cand["eps"], 1e-5).any() else cand["eps"].max()
        cand = cand[_is(cand["eps"], eps_pick)]
        for col, want in (("gate", "none"), ("norm", "rmsnorm")):
            if (cand[col] == want).any():
                cand = cand[cand[col] == want]
    return str(cand["setting"].value_counts().index[0])


@dataclass
class EffectiveSize:
    status: str  # "fit" or the reason there is none
    baseline_gamma: float
    baseline_setting: str | None
    fit: PowerLaw | None = None
    points: pd.DataFrame | None = None  # baseline: size, n_params, loss, seeds
    gains: pd.DataFrame | None = None  # variant, gamma, setting, size, n_params, loss, n_eff, gain, gain_lo, gain_hi, interval
    boot_fits: int = 0


def _seed_means(df: pd.DataFrame, metric: str) -> pd.Series:
    return df.groupby(list(SEED_COLS))[metric].mean()


def effective_size(sweep: Sweep, baseline_gamma: float = 0.5, prefer: dict[str, str] | None = None,
                   metric: str = LOSS, n_boot: int = N_BOOT, seed: int = 0) -> EffectiveSize:
    df = sweep.complete
    setting = choose_baseline_setting(df, baseline_gamma, prefer)
    if setting is None:
        return EffectiveSize(f"no COMPLETE trial at the baseline gamma = {baseline_gamma:g} (pass --baseline-gamma)",
                             baseline_gamma, None)
    base = df[baseline_mask(df, baseline_gamma, setting)]
    sizes = base.groupby("size").agg(n_params=("n_params", "mean"), loss=(metric, "mean"), seeds=("seed", "nunique"))
    sizes = sizes.reset_index().sort_values("n_params")
    if len(sizes) < 3 or sizes["n_params"].nunique() < 3:
        have = ", ".join(sizes["size"]) or "none"
        return EffectiveSize(
            f"needs the baseline (γ={baseline_gamma:g}, {setting}) at ≥ 3 model sizes to fit L(N) = E + A·N^-α; "
            f"this sweep has {len(sizes)} ({have}). Run the same grid at more sizes, e.g. one sweep per "
            f"model=nano, micro, mini, and pass them together: make report SWEEP=sweeps/a,sweeps/b,sweeps/c",
            baseline_gamma, setting, points=sizes)
    fit = fit_power_law(sizes["n_params"], sizes["loss"])
    losses = sizes["loss"].to_numpy(dtype=float)
    if np.all(np.diff(losses) < 0) and fit.E <= 0:
        # The offset sits on its bound: the losses fall too slowly over this range to tell the
        # irreducible loss from the power law, and N_eff would be an extrapolation of nothing.
        trend = " → ".join(f"{r['loss']:.4f} ({r['n_params'] / 1e6:.2f}M)" for _, r in sizes.iterrows())
        return EffectiveSize(
            f"the baseline's L(N) fit is degenerate (E = 0, α = {fit.alpha:.3f}: its loss falls only {trend} over "
            f"a {sizes['n_params'].max() / sizes['n_params'].min():.0f}x range of N), so no effective size can be "
            "read from it: train longer or span more sizes", baseline_gamma, setting, points=sizes)
    if not (np.all(np.diff(losses) < 0) and fit.A > 0 and fit.alpha > 0):
        # An effective size reads a variant's loss off the baseline's L(N); where a larger
        # baseline is not better (too few tokens for the larger models, typically) there is
        # no such curve, and any N_eff would be an artefact of the fit.
        trend = ", ".join(f"{r['size'].split(' ')[0]} {r['loss']:.4f}" for _, r in sizes.iterrows())
        return EffectiveSize(
            f"the baseline's loss does not fall with model size ({trend}), so there is no L(N) to read an "
            "effective size from: the larger models are undertrained at this budget (raise train.max_tokens, "
            "or use train.tokens_per_param)", baseline_gamma, setting, points=sizes)
    others = df[~baseline_mask(df, baseline_gamma, setting)]
    rows = []
    for (variant, size), g in others.groupby(["variant", "size"], sort=True):
        loss = float(g[metric].mean())
        n = float(g["n_params"].mean())
        n_eff = float(fit.n_eff(loss))
        rows.append(dict(variant=variant, gamma=float(g["gamma"].iloc[0]), setting=g["setting"].iloc[0], size=size,
                         n_params=n, loss=loss, seeds=int(g["seed"].nunique()), n_eff=n_eff, gain=n_eff / n - 1))
    gains = pd.DataFrame(rows)
    boot = _bootstrap(base, others, sizes, gains, metric, n_boot, seed) if not gains.empty else None
    if boot is not None:
        gains["gain_lo"], gains["gain_hi"], gains["interval"] = boot[0][:, 0], boot[0][:, 1], boot[1]
    return EffectiveSize("fit", baseline_gamma, setting, fit, sizes, gains, boot_fits=n_boot if boot is not None else 0)


def _bootstrap(base: pd.DataFrame, others: pd.DataFrame, sizes: pd.DataFrame, gains: pd.DataFrame, metric: str,
               n_boot: int, seed: int) -> tuple[np.ndarray, str] | None:
    """95% percentile interval of each gain. Over seeds (paired: a variant reuses the baseline's
    draw of seeds at its size) when every point has >= 2 seeds; else over the eval tokens,
    shifting each trial's loss by its resampled per-token mean (same tokens for every trial),
    which measures evaluation noise only."""
    rng = np.random.default_rng(seed)
    base_by_size = {s: _seed_means(g, metric) for s, g in base.groupby("size")}
    var_by_key = {k: _seed_means(g, metric) for k, g in others.groupby(["variant", "size"])}
    order = list(sizes["size"])
    n_params = sizes["n_params"].to_numpy(dtype=float)
    seeds_ok = all(len(v) >= 2 for v in base_by_size.values()) and all(len(v) >= 2 for v in var_by_key.values())
    reps = np.full((len(gains), n_boot), np.nan)
    if seeds_ok:
        kind = "seed bootstrap"
        for r in range(n_boot):
            draws = {s: rng.choice(len(base_by_size[s]), len(base_by_size[s])) for s in order}
            losses = [base_by_size[s].iloc[draws[s]].mean() for s in order]
            fit = fit_power_law(n_params, losses)
            for i, row in gains.iterrows():
                v = var_by_key[(row["variant"], row["size"])]
                keys = base_by_size[row["size"]].index[draws[row["size"]]] if row["size"] in draws else []
                if len(keys) and all(k in v.index for k in keys):
                    lv = v.loc[keys].mean()
                else:
                    lv = v.iloc[rng.choice(len(v), len(v))].mean()
                reps[i, r] = fit.n_eff(lv) / row["n_params"] - 1
    else:
        kind = "eval-token bootstrap (one seed: evaluation noise only)"
        tok = {}
        for frame in (base, others):
            for _, t in frame.iterrows():
                pt = read_per_token(t.get("per_token_losses_path"))
                if pt is None:
                    return None
                tok[t["identity"]] = (pt[1], float(t[metric]))
        lengths = {len(v[0]) for v in tok.values()}
        if len(lengths) != 1:
            return None
        n_tok = lengths.pop()
        centre = {k: v[0].mean() for k, v in tok.items()}
        for r in range(n_boot):
            idx = rng.integers(0, n_tok, n_tok)
            shifted = {k: v[1] + v[0][idx].mean() - centre[k] for k, v in tok.items()}
            losses = [np.mean([shifted[i] for i in base[base["size"] == s]["identity"]]) for s in order]
            fit = fit_power_law(n_params, losses)
            for i, row in gains.iterrows():
                ids = others[(others["variant"] == row["variant"]) & (others["size"] == row["size"])]["identity"]
                reps[i, r] = fit.n_eff(np.mean([shifted[j] for j in ids])) / row["n_params"] - 1
    with np.errstate(invalid="ignore"):
        ci = np.nanpercentile(np.where(np.isinf(reps), 1e12, reps), [2.5, 97.5], axis=1).T
    ci = np.where(ci >= 1e12, math.inf, ci)
    return ci, kind
