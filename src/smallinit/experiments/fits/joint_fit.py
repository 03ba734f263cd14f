"""One L(N, D) law for both arms, so the recipe's effective size is one number.

    L_arm(N, D) = E + A_arm N^-alpha + B_arm D^-beta

E, alpha and beta are shared (the data's irreducible loss and the exponents belong to the task
and the architecture), A and B are each arm's. The recipe then trains like a baseline with
N_eff/N = (A_baseline / A_recipe)^(1/alpha) times the parameters and D_eff/D =
(B_baseline / B_recipe)^(1/beta) times the tokens, at every (N, D). Fitting each arm on its own
(scaling_law's approach) lets E and alpha absorb the arms' difference, and with E on its bound
N_eff/N moved by orders of magnitude.

Because E is weakly identified over a narrow range of N and D, `sensitivity` refits with E held
at several values and reports N_eff/N at each: a record quotes the ratio together with how far
it moves. Least squares on the cell means (scipy.optimize.least_squares, several starts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import least_squares


@dataclass
class JointFit:
    E: float
    alpha: float
    beta: float
    A: dict[str, float]
    B: dict[str, float]
    sse: float
    n_cells: int
    e_fixed: bool

    def n_ratio(self, baseline: str, recipe: str) -> float:
        return (self.A[baseline] / self.A[recipe]) ** (1 / self.alpha)

    def d_ratio(self, baseline: str, recipe: str) -> float:
        return (self.B[baseline] / self.B[recipe]) ** (1 / self.beta)

    def predict(self, arm: str, n, d):
        return self.E + self.A[arm] * np.asarray(n, float) ** -self.alpha + self.B[arm] * np.asarray(d, float) ** -self.beta


def fit(cells: pd.DataFrame, e_fixed: float | None = None, starts: int = 12, seed: int = 0) -> JointFit:
    """cells: arm, n (parameters), d (tokens), loss (a seed mean per cell). Parameters are fitted
    as log A, log B (positive), alpha and beta in (0, 2], E in [0, min loss)."""
    arms = sorted(cells["arm"].unique())
    idx = cells["arm"].map({a: i for i, a in enumerate(arms)}).to_numpy()
    ln_n, ln_d, y = np.log(cells["n"].to_numpy(float)), np.log(cells["d"].to_numpy(float)), cells["loss"].to_numpy(float)
    k = len(arms)
    floor = float(y.min())

    def unpack(p):
        e = e_fixed if e_fixed is not None else p[0]
        q = p if e_fixed is not None else p[1:]
        return e, q[0], q[1], q[2:2 + k], q[2 + k:2 + 2 * k]

    def residuals(p):
        e, alpha, beta, log_a, log_b = unpack(p)
        return e + np.exp(log_a[idx] - alpha * ln_n) + np.exp(log_b[idx] - beta * ln_d) - y

    lo = [0.01, 0.01] + [-20.0] * (2 * k)
    hi = [2.0, 2.0] + [40.0] * (2 * k)
    if e_fixed is None:
        lo, hi = [0.0, *lo], [floor - 1e-6, *hi]
    rng = np.random.default_rng(seed)
    best = None
    for _ in range(starts):
        alpha, beta = rng.uniform(0.05, 0.8, 2)
        e0 = e_fixed if e_fixed is not None else rng.uniform(0, floor * 0.9)
        share = max(floor - e0, 1e-3) / 2  # each term starts at half the loss above E
        log_a = np.full(k, math.log(share) + alpha * ln_n.mean())
        log_b = np.full(k, math.log(share) + beta * ln_d.mean())
        p0 = np.array([alpha, beta, *log_a, *log_b])
        if e_fixed is None:
            p0 = np.array([e0, *p0])
        p0 = np.clip(p0, np.array(lo) + 1e-9, np.array(hi) - 1e-9)
        r = least_squares(residuals, p0, bounds=(lo, hi), x_scale="jac", max_nfev=5000)
        if best is None or r.cost < best.cost:
            best = r
    e, alpha, beta, log_a, log_b = unpack(best.x)
    return JointFit(E=float(e), alpha=float(alpha), beta=float(beta),
                    A={a: float(math.exp(v)) for a, v in zip(arms, log_a)},
                    B={a: float(math.exp(v)) for a, v in zip(arms, log_b)},
                    sse=float(2 * best.cost), n_cells=len(y), e_fixed=e_fixed is not None)


def sensitivity(cells: pd.DataFrame, baseline: str, recipe: str, e_values=(0.0, 1.0, 2.0, 3.0)) -> pd.DataFrame:
    """N_eff/N and D_eff/D with E free and held at each of e_values (those below the lowest loss),
    and each arm's root-mean-square miss: a law that misses one arm's cells by more than their
    seed spread does not describe that arm, and its ratio is not a reading."""
    rows = []
    floor = float(cells["loss"].min())
    for e in [None, *[v for v in e_values if v < floor]]:
        f = fit(cells, e_fixed=e)
        miss = cells["loss"].to_numpy(float) - np.array([f.predict(a, n, d) for a, n, d in zip(cells["arm"], cells["n"], cells["d"])])
        rms = {f"rms_{arm}": float(np.sqrt(np.mean(miss[(cells["arm"] == arm).to_numpy()] ** 2))) for arm in (baseline, recipe)}
        rows.append(dict(E=f.E, e_fixed=f.e_fixed, alpha=f.alpha, beta=f.beta, sse=f.sse,
                         n_ratio=f.n_ratio(baseline, recipe), d_ratio=f.d_ratio(baseline, recipe), **rms))
    return pd.DataFrame(rows)
