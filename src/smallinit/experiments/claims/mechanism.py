"""The paper's mechanism, read from the probes: condensation then expansion of the weights,
the attention sink, norm saturation, and the residual balance at init.

- Probe curves: the `/mean` probe keys of metrics.jsonl over training, per trial.
- Condensation then expansion (per trial, on the mean row-wise |cos| of the block matrices):
  condensed if the largest value after step 0 exceeds the step-0 value by CONDENSE_REL of it;
  expanded if, after that peak, it falls back by EXPAND_REL of the rise. Stable rank is
  reported beside it (it falls while rows align).
- Heatmaps: row-cosine matrices from probes/step_*.npz at init, the early snapshot where small
  init is most condensed, and the end.
- Residual balance needs no training: Transformer(ModelConfig(...)) at each width and gamma,
  one forward pass, `residual_ratio/mean` = ||block update|| / ||block input||. The paper's
  argument predicts ~ d^(1 - gamma): flat exactly at gamma = 1. `balance_at_init` is the
  report's whole check (models built, probed, exponents fitted); `balance_setup` states it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from smallinit.experiments.data.load import Sweep
from smallinit.experiments.data.trial_files import probe_snapshots, read_metrics, read_snapshot

PROBE_KINDS = ("row_cosine", "stable_rank", "attn_sink", "saturation", "residual_ratio")
CONDENSE_REL = 0.10
EXPAND_REL = 0.10
HEATMAP_MATRICES = ("blocks.0.ffn.w1", "blocks.0.attn.q_proj")
# The residual-balance models: the report's description is written from these, so it states
# what ran. The first eps is the one the exponents are fitted at.
BALANCE_LAYERS = 2
BALANCE_HEAD_DIM = 64
BALANCE_VOCAB = 256
BALANCE_BATCH, BALANCE_SEQ = 2, 32  # random tokens of one forward pass
BALANCE_EPS = (1e-12, 1e-5)


def probe_curves(sweep: Sweep) -> pd.DataFrame:
    """Long frame: identity, step, tokens, val_loss and each probe kind's mean, per logged step."""
    frames = []
    for _, r in sweep.complete.iterrows():
        m = read_metrics(r.get("metrics_path"))
        if m.empty:
            continue
        out = pd.DataFrame({"identity": r["identity"], "step": m["step"],
                            "tokens": m.get("tokens", pd.Series(np.nan, index=m.index)),
                            "val_loss": m.get("val/loss", pd.Series(np.nan, index=m.index))})
        for kind in PROBE_KINDS:
            out[kind] = m[f"{kind}/mean"] if f"{kind}/mean" in m else np.nan
        # Training-only rows (train.log_every) carry neither: the curves are evaluations and probes.
        frames.append(out.dropna(subset=["val_loss", *PROBE_KINDS], how="all"))
    if not frames:
        return pd.DataFrame(columns=["identity", "step", "tokens", "val_loss", *PROBE_KINDS])
    cols = ["identity", "size", "variant", "gamma_curve", "gamma", "eps", "gate", "seed", "d_model", "setting"]
    return pd.concat(frames, ignore_index=True).merge(sweep.complete[cols], on="identity")


@dataclass
class Trajectory:
    identity: str
    start: float
    peak: float
    peak_step: int
    final: float
    condensed: bool
    expanded: bool
    rank_start: float
    rank_min: float
    rank_final: float

    at_end: bool = False  # the peak is the last logged probe: still rising when training stopped

    @property
    def pattern(self) -> bool:
        return self.condensed and self.expanded

    @property
    def status(self) -> str:
        if not self.condensed:
            return "no condensation"
        if self.expanded:
            return "condense, expand"
        return "condense, still rising at the end" if self.at_end else "condense, plateau"


def trajectory(curve: pd.DataFrame) -> Trajectory | None:
    """Condensation/expansion of one trial's row_cosine curve (rows in step order)."""
    c = curve.dropna(subset=["row_cosine"]).sort_values("step")
    if len(c) < 3 or c["step"].iloc[0] != 0:
        return None
    rc, sr = c["row_cosine"].to_numpy(), c["stable_rank"].to_numpy()
    start, later = rc[0], rc[1:]
    i = int(np.argmax(later)) + 1
    peak, final = rc[i], rc[-1]
    rise = peak - start
    condensed = rise > CONDENSE_REL * start
    expanded = condensed and i < len(rc) - 1 and (peak - final) > EXPAND_REL * rise
    return Trajectory(str(c["identity"].iloc[0]), float(start), float(peak), int(c["step"].iloc[i]), float(final),
                      bool(condensed), bool(expanded), float(sr[0]), float(np.nanmin(sr)), float(sr[-1]),
                      at_end=i == len(rc) - 1)


def trajectories(curves: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, c in curves.groupby("identity"):
        t = trajectory(c)
        if t is not None:
            first = c.iloc[0]
            rows.append({**t.__dict__, "pattern": t.pattern, "status": t.status, "size": first["size"], "variant": first["variant"],
                         "gamma": first["gamma"], "seed": first["seed"]})
    return pd.DataFrame(rows)


def heatmap_panels(sweep: Sweep, variants: list[str], size: str) -> tuple[str, list[int], dict] | None:
    """(matrix name, [steps], {variant: [matrix per step]}) for the first seed of each variant.

    Steps: init, the snapshot where the first variant whose gamma >= 1 is most condensed
    (mean |cos| off the diagonal), and the last."""
    df = sweep.complete[(sweep.complete["size"] == size) & sweep.complete["variant"].isin(variants)]
    snaps: dict[str, list[tuple[int, object]]] = {}
    for v in variants:
        rows = df[df["variant"] == v].sort_values(["init_seed", "train_seed"])
        if not rows.empty:
            s = probe_snapshots(rows.iloc[0].get("probes_dir"))
            if s:
                snaps[v] = s
    if not snaps:
        return None
    first = read_snapshot(next(iter(snaps.values()))[0][1])
    name = next((m for m in HEATMAP_MATRICES if m in first), sorted(first)[0] if first else None)
    if name is None:
        return None
    small = [v for v in snaps if df[df["variant"] == v]["gamma"].iloc[0] >= 1] or list(snaps)
    steps_small = snaps[small[0]]
    interior = steps_small[1:-1] or steps_small[1:2] or steps_small[:1]
    early = max(interior, key=lambda sp: _offdiag(read_snapshot(sp[1]).get(name)))[0]
    steps = sorted({steps_small[0][0], early, steps_small[-1][0]})
    panels = {}
    for v, s in snaps.items():
        by_step = dict(s)
        mats = []
        for step in steps:
            nearest = min(by_step, key=lambda k: abs(k - step))
            mats.append(read_snapshot(by_step[nearest]).get(name))
        panels[v] = mats
    return name, steps, panels


def _offdiag(m) -> float:
    if m is None or m.shape[0] < 2:
        return -1.0
    n = m.shape[0]
    return float((np.abs(m).sum() - np.abs(np.diag(m)).sum()) / (n * (n - 1)))


@dataclass
class Balance:
    data: pd.DataFrame  # per (width, gamma, eps): residual_ratio, saturation, attn_sink at init
    slopes: pd.DataFrame  # per gamma: the measured exponent of residual_ratio in width, and 1 - gamma


def balance_at_init(widths, gammas) -> Balance:
    """The residual-balance check: a model per (width, gamma), probed once, exponents fitted."""
    data = residual_balance(widths=widths, gammas=gammas)
    return Balance(data, balance_slopes(data))


def balance_setup(widths) -> str:
    """What `balance_at_init` measures, in the report's words."""
    return (f"Transformer(ModelConfig(d_model=d, n_layers={BALANCE_LAYERS}, heads of {BALANCE_HEAD_DIM}, d_ff=2d, "
            f"vocab {BALANCE_VOCAB}, eps={BALANCE_EPS[0]:g})) at widths {', '.join(map(str, widths))}, one forward "
            f"pass over {BALANCE_BATCH}×{BALANCE_SEQ} random tokens, model.probes.activation_probes()"
            "['residual_ratio/mean'] = ‖block update‖/‖block input‖.")


def residual_balance(widths=(64, 128, 256, 512, 1024, 2048), gammas=(0.5, 0.75, 1.0, 1.25),
                     eps_values=BALANCE_EPS, n_layers: int = BALANCE_LAYERS, vocab: int = BALANCE_VOCAB,
                     seq_len: int = BALANCE_SEQ, batch: int = BALANCE_BATCH, seed: int = 0) -> pd.DataFrame:
    """Probes at init across widths: residual_ratio, saturation and attn_sink per (width, gamma, eps).

    Heads of BALANCE_HEAD_DIM channels (one head below that), d_ff = 2 d; eps is set on the built norms rather
    than rebuilding the model, since it changes no weight (tests check this equals a rebuild)."""
    import torch

    from smallinit.model import InitConfig, ModelConfig, NormConfig, Transformer
    from smallinit.model.probes import activation_probes

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # batch 2 x 32 tokens: more threads only contend (measured 8x slower with 2)
    try:
        idx = torch.randint(0, vocab, (batch, seq_len), generator=torch.Generator().manual_seed(seed))
        rows = []
        for d in widths:
            for gamma in gammas:
                cfg = ModelConfig(d_model=d, n_layers=n_layers, n_heads=max(1, d // BALANCE_HEAD_DIM), d_ff=2 * d, vocab_size=vocab,
                                  max_seq_len=seq_len, tie_embeddings=True, norm=NormConfig(eps=eps_values[0]),
                                  init=InitConfig(gamma=gamma, seed=seed))
                with torch.device("meta"):  # skip nn's default init: init_weights() writes every weight
                    model = Transformer(cfg)
                model.to_empty(device="cpu")
                model.init_weights()
                for eps in eps_values:
                    set_norm_eps(model, eps)
                    p = activation_probes(model, idx)
                    rows.append(dict(width=d, gamma=gamma, eps=eps, residual_ratio=p["residual_ratio/mean"],
                                     saturation=p["saturation/mean"], attn_sink=p["attn_sink/mean"]))
        return pd.DataFrame(rows)
    finally:
        torch.set_num_threads(threads)


def set_norm_eps(model, eps: float) -> None:
    from smallinit.model.layers import LayerNorm, RMSNorm

    for m in model.modules():
        if isinstance(m, RMSNorm | LayerNorm):
            m.eps = eps


def balance_slopes(rb: pd.DataFrame, eps: float = BALANCE_EPS[0]) -> pd.DataFrame:
    """Measured exponent of residual_ratio ~ d^k per gamma (least squares on log-log) vs 1 - gamma."""
    rows = []
    for gamma, g in rb[np.isclose(rb["eps"], eps)].groupby("gamma"):
        k, c = np.polyfit(np.log(g["width"]), np.log(g["residual_ratio"]), 1)
        rows.append(dict(gamma=gamma, measured=float(k), predicted=1 - gamma, intercept=float(c), widths=len(g),
                         spread=float(g["residual_ratio"].max() / g["residual_ratio"].min())))
    return pd.DataFrame(rows)

