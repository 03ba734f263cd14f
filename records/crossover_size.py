"""The recipe's effective size at the crossover record's width, two ways, and the joint refit of
scaling_law's recorded cells:

1. **Off the baseline's measured widths** (fits/effective_width.py): at each budget, the
   baseline's loss against ln N over d = 96, 128, 192 (crossover_widths and the crossover record's
   own baseline), and where the recipe at d = 128 sits on it; a bound beyond the measured widths.
2. **One L(N, D) law for both arms** (fits/joint_fit.py) over the same cells (seed means), with
   shared E, alpha, beta, and how N_eff/N moves when E is held elsewhere.
3. **scaling_law's cells, refitted jointly**: the cells its summary.json holds (the recipe at 4
   widths x 3 budgets; the baseline's per-budget cells were not kept, only its 4 widths at the
   largest budget), with the same E sensitivity.

Every cell uses each (setting, budget)'s own chosen lr (protocol.json, per_budget), the confirm
seeds only. N is the non-embedding parameter count of each arm's own model.

    python -m records.crossover_size --crossover sweeps/crossover \\
        [--widths sweeps/crossover_widths] [--scaling-law docs/results/scaling_law/summary.json] [--out size.md [--append]]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from smallinit.core import results_schema as schema
from smallinit.core.markdown import table as md_table
from smallinit.experiments.fits.effective_size import non_embedding_params
from smallinit.experiments.fits.effective_width import effective_width
from smallinit.experiments.fits.joint_fit import sensitivity

from . import OVERWRITE_HELP, committed_record, sweep_protocol, sweep_table, write_record

LOSS = schema.FINAL_VAL_LOSS
# What makes the widths sweep's baseline the crossover record's baseline at another width: the arm
# (γ, eps, gate, norm), the depth, heads and FFN, and everything that shapes its training and its
# evaluation (schedule, warmup, batch, weight decay, cooldown, held-out tokens, corpus).
# The warmup is held in steps: a widths sweep that stops at a smaller largest budget than the record
# (registry_widths at 8M beside crossover_registry's 16M) has a larger warmup_frac for the same 102 steps.
SAME_ARM = ("gamma", "eps", "gate", "norm", "n_layers", "ffn", "dtype", "config/model.n_heads", "config/optim.schedule",
            "warmup_steps", "weight_decay", "config/train.batch_size", "config/train.seq_len",
            "config/train.cooldown_frac", "config/train.eval_tokens", "task", "config/data.corpus",
            "config/data.vocab_size", "config/data.val_fraction", "config/data.split_seed")
E_VALUES = (0.0, 1.0, 2.0, 3.0)
HEADS = "config/model.n_heads"


def _lr_key(x: float) -> float:
    return float(f"{x:.6g}")


def chosen_rows(sweep: Path) -> pd.DataFrame:
    """The confirm branches of a per_budget sweep, each (setting, budget) at the lr it chose:
    arm, d_model, n (non-embedding), seed, budget, loss, plus the columns SAME_ARM names."""
    record, df = sweep_protocol(sweep), sweep_table(sweep)
    if not record:
        raise SystemExit(f"error: {sweep} holds no protocol.json: run its sweep first")
    if not record.get("per_budget"):
        raise SystemExit(f"error: {sweep} did not choose an lr per budget (hydra.sweeper.protocol.per_budget)")
    df = df[(df[schema.STATE] == schema.COMPLETE) & (df["role"] == "confirm") & df[LOSS].notna()]
    keep = np.zeros(len(df), bool)
    for c in record.get("choices", []):
        mine = np.ones(len(df), bool)
        for key, value in c["setting"].items():
            mine &= (df[schema.analysis_column(key)] == value).to_numpy()
        for x in c.get("chosen_by_budget") or []:
            at = (df[schema.BUDGET_TOKENS] == x["budget_tokens"]).to_numpy()
            lr = df["lr"].map(_lr_key).to_numpy() == _lr_key(x["chosen"]["optim.lr"])
            keep |= mine & at & lr
    df = df[keep]
    arm = df["config/arm"] if "config/arm" in df else pd.Series("baseline", index=df.index)
    n = non_embedding_params(df["n_params"].to_numpy(float), df["d_model"].to_numpy(),
                             int(df["config/model.vocab_size"].iloc[0]) if len(df) else 0,
                             bool(df["config/model.tie_embeddings"].iloc[0]) if len(df) else False)
    return pd.DataFrame({"arm": arm.to_numpy(), "d_model": df["d_model"].to_numpy(), "n": n,
                         "seed": df["train_seed"].to_numpy(), "budget": df[schema.BUDGET_TOKENS].astype(int).to_numpy(),
                         "loss": df[LOSS].to_numpy(), "warmup_steps": warmup_steps(df),
                         **{k: df[k].to_numpy() for k in SAME_ARM if k in df}})


def warmup_steps(df: pd.DataFrame) -> np.ndarray:
    """Each row's warmup in steps: optim.warmup_frac of its run's steps, the largest budget's with
    train.budgets (trainer/schedule.py), else max_tokens' or max_steps (lr_at)."""
    def one(row) -> int:
        raw = row.get("config/train.budgets")
        budgets = json.loads(raw) if isinstance(raw, str) else None
        grad_accum = row.get("config/train.grad_accum", 1)
        per_step = row["config/train.batch_size"] * row["config/train.seq_len"] * (1 if pd.isna(grad_accum) else grad_accum)
        if budgets:
            steps = max(budgets) // per_step
        elif pd.notna(row.get("config/train.max_steps")):
            steps = row["config/train.max_steps"]
        else:
            tokens = row.get("config/train.max_tokens")
            steps = tokens // per_step if pd.notna(tokens) else 0
        return int(row["config/optim.warmup_frac"] * steps)
    return np.array([one(r) for _, r in df.iterrows()], dtype=int)


def check_same_baseline(crossover: pd.DataFrame, widths: pd.DataFrame, baseline: str) -> None:
    """The widths sweep must train the crossover's baseline arm, the same way, at other widths."""
    ours = crossover[crossover["arm"] == baseline]
    for key in SAME_ARM:
        if key not in ours or key not in widths:
            raise SystemExit(f"error: {key} is not in both results tables: the widths sweep cannot be shown to train "
                             "the crossover's baseline the same way")
        a, b = set(ours[key].astype(str)), set(widths[key].astype(str))
        if a != b:
            raise SystemExit(f"error: the widths sweep's {key}={sorted(b)} is not the crossover baseline's "
                             f"{sorted(a)}: it must train the same arm, the same way, at other widths")


def width_readings(rows: pd.DataFrame, baseline: str, recipe: str) -> list[dict]:
    """Per budget: N_eff/N of the recipe read off the baseline's measured widths."""
    out = []
    for budget, g in rows.groupby("budget"):
        base, rec = g[g["arm"] == baseline], g[g["arm"] == recipe]
        if rec.empty or base["d_model"].nunique() < 2:
            continue
        n_self = float(rec["n"].iloc[0])
        r = effective_width(base.rename(columns={"n": "n_params"})[["seed", "n_params", "loss"]], rec[["seed", "loss"]], n_self)
        heads = base.groupby("d_model")[HEADS].first() if HEADS in base else {}
        widths = sorted(int(w) for w in base["d_model"].unique())
        out.append(dict(budget=int(budget), widths=widths, head_dims=[w // int(heads[w]) if w in heads else None for w in widths],
                        seeds=int(rec["seed"].nunique()), recipe_loss=float(rec["loss"].mean()), **r))
    return out


def widths_table(readings: list[dict], verdicts: dict[int, str]) -> str:
    header = ["budget [tokens]", "crossover verdict", "baseline widths (head dim)", "recipe loss", "N_eff/N", "seeds read inside"]
    rows = [[f"{r['budget']:,}", verdicts.get(r["budget"], "–"), _widths_text(r), f"{r['recipe_loss']:.4f}",
             r["text"], f"{r['n_inside']} of {r['n_seeds']}"] for r in readings]
    return md_table(header, rows)


def _widths_text(r: dict) -> str:
    """"96 (48), 128 (64), 192 (96)": each width with its head dim, since a family of widths at a
    fixed head count changes the head dim with the width (the crossover's: 2 heads throughout)."""
    dims = r.get("head_dims") or [None] * len(r["widths"])
    return ", ".join(f"{w} ({h})" if h else f"{w}" for w, h in zip(r["widths"], dims))


def cell_means(rows: pd.DataFrame) -> pd.DataFrame:
    """Seed means per (arm, n, budget): the cells a law is fitted to."""
    return (rows.groupby(["arm", "n", "budget"])["loss"].agg(["mean", "count", "std"]).reset_index()
            .rename(columns={"budget": "d", "mean": "loss", "count": "seeds", "std": "sd"}))


def sensitivity_table(cells: pd.DataFrame, baseline: str, recipe: str) -> str:
    s = sensitivity(cells[["arm", "n", "d", "loss"]], baseline, recipe, E_VALUES)
    rows = [["free" if not r.e_fixed else "held", f"{r.E:.3f}", f"{r.alpha:.3f}", f"{r.beta:.3f}",
             f"{r[f'rms_{baseline}']:.4f}", f"{r[f'rms_{recipe}']:.4f}", f"{r.n_ratio:.3g}", f"{r.d_ratio:.3g}"]
            for _, r in s.iterrows()]
    table = md_table(["E", "E [nats]", "α", "β", f"rms miss, {baseline}", f"rms miss, {recipe}", "N_eff/N", "D_eff/D"], rows)
    return table + "\n\n" + spread_line(cells, (baseline, recipe))


def spread_line(cells: pd.DataFrame, arms) -> str:
    """The seed spread the rms misses are read against: each arm's per-cell seed sd (median and
    range over the cells that record one)."""
    parts = []
    for arm in arms:
        sd = cells.loc[cells["arm"] == arm, "sd"].dropna() if "sd" in cells else pd.Series(dtype=float)
        parts.append(f"{arm} {sd.median():.4f} [{sd.min():.4f}, {sd.max():.4f}] over {len(sd)} of "
                     f"{int((cells['arm'] == arm).sum())} cells" if len(sd) else f"{arm}: none recorded")
    return "Seed sd per cell (median [range]): " + "; ".join(parts) + "."


def scaling_law_cells(summary: dict) -> pd.DataFrame:
    """The cells scaling_law's summary.json holds: the recipe's per (width, budget) seed means
    (effective_size.cells) and the baseline's at the largest budget (budget.below_unigram), each
    with its own non-embedding count (width_trend.points)."""
    es, points = summary["effective_size"], summary["width_trend"]["points"]
    vocab, tie = int(es["vocab_size"]), bool(es["tie_embeddings"])
    n_of = {p["d_model"]: {"baseline": float(non_embedding_params(p["n_params_baseline"], p["d_model"], vocab, tie)),
                           "recipe": float(non_embedding_params(p["n_params_recipe"], p["d_model"], vocab, tie))}
            for p in points}
    largest = max(float(c["budget_tokens"]) for c in es["cells"])
    d_of = {p["size"]: p["d_model"] for p in points}
    # The seed sd the summary keeps: the largest budget's cells, by size and arm ("cells").
    sd = {(d_of.get(c["size"]), "recipe" if c["gamma"] == 1 and "elementwise" in c["setting"] else "baseline"
           if c["gamma"] == 0.5 and "gate=none" in c["setting"] else None): c["sd"] for c in summary.get("cells", [])}
    rows = [dict(arm="recipe", n=n_of[int(c["d_model"])]["recipe"], d=float(c["budget_tokens"]), loss=c["loss"],
                 seeds=c["seeds"], sd=sd.get((int(c["d_model"]), "recipe")) if float(c["budget_tokens"]) == largest else None)
            for c in es["cells"]]
    for c in summary["budget"]["below_unigram"]:
        if c["variant"] == es["baseline"] and c["size"] in d_of:
            rows.append(dict(arm="baseline", n=n_of[d_of[c["size"]]]["baseline"], d=largest, loss=c["loss"],
                             seeds=c["seeds"], sd=sd.get((d_of[c["size"]], "baseline"))))
    return pd.DataFrame(rows)


def report(crossover: Path | None, widths: Path | None, scaling_law: Path | None, baseline: str = "baseline") -> str:
    """Markdown with bold titles, not headings, so a record page can show it verbatim."""
    parts = [] if crossover is None else crossover_parts(crossover, widths, baseline)
    if scaling_law is not None:
        cells = scaling_law_cells(committed_record(Path(scaling_law)))
        rec, base = cells[cells["arm"] == "recipe"], cells[cells["arm"] == "baseline"]
        parts += ["**scaling_law's recorded cells, refitted jointly** (`python -m records.crossover_size "
                  "--scaling-law`): one L(N, D) law for both arms, shared E, α, β, each arm's A and B, over "
                  f"{len(rec)} recipe cells ({rec['n'].nunique()} widths x {rec['d'].nunique()} budgets) and "
                  f"{len(base)} baseline cells ({base['n'].nunique()} widths at the largest budget: the "
                  "baseline's per-budget cells were not kept in the record, only its fit). With the baseline at one "
                  "budget, its B is told apart from E only through the shared β. A law that misses an arm's cells by "
                  "more than their seed spread does not describe that arm, and its N_eff/N is then not a reading.", "",
                  sensitivity_table(cells, "baseline", "recipe"), ""]
    return "\n".join(parts)


def crossover_parts(crossover: Path, widths: Path | None, baseline: str) -> list[str]:
    from smallinit.experiments.fits.token_crossover import from_sweep

    rows = chosen_rows(crossover)
    arms = sorted(set(rows["arm"]))
    if baseline not in arms or len(arms) != 2:
        raise SystemExit(f"error: --crossover={str(crossover)!r} has arms {arms}; it needs {baseline!r} and one other")
    recipe = next(a for a in arms if a != baseline)
    tc = from_sweep(crossover, baseline=baseline)
    verdicts = {int(g["tokens"]): g["verdict"] for g in (tc or {}).get("budgets", [])}
    width = int(rows["d_model"].iloc[0])
    if widths is None:
        return [f"**The recipe's effective size at d = {width}**: not measured yet. The baseline has not run at the "
                "neighbouring widths (`python sweep.py -m +experiment=crossover_widths`), so there is no curve to read "
                "N_eff off, and no bound either.", ""]
    w = chosen_rows(widths)
    check_same_baseline(rows, w, baseline)
    both = pd.concat([rows, w.assign(arm=baseline)], ignore_index=True)
    return [f"**The recipe's effective size at d = {width}, off the baseline's measured widths** ({recipe} against "
            f"{baseline}). Each budget at each width's own chosen lr; N_eff/N over the seeds' ln N_eff/N (t-interval) "
            "where every seed reads inside the measured widths, else a bound. Read it where the crossover verdict says "
            "the recipe is ahead; elsewhere it is the same gap in other units.", "",
            widths_table(width_readings(both, baseline, recipe), verdicts), "",
            "**One L(N, D) law for both arms over these cells**: shared E, α, β; each arm's A and B (seed means per "
            "cell). E is weakly identified over the narrow range of N these widths span: the rows with E held show how "
            "far N_eff/N moves with it. A law that misses an arm's cells by more than their seed spread does not "
            "describe that arm.", "",
            sensitivity_table(cell_means(both), baseline, recipe), ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crossover", type=Path, help="the crossover record's sweep folder")
    ap.add_argument("--widths", type=Path, help="the crossover_widths sweep folder (baseline at other widths)")
    ap.add_argument("--scaling-law", type=Path, help="scaling_law's summary.json, to refit its cells jointly")
    ap.add_argument("--baseline", default="baseline", help="the baseline arm's name (config/arm)")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    ap.add_argument("--append", action="store_true", help="add to --out after a blank line (a record's checks.md "
                                                          "that another check wrote first)")
    ap.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    args = ap.parse_args(argv)
    if args.crossover is None and args.scaling_law is None:
        ap.error("give --crossover (with --widths once it has run), --scaling-law, or both")
    if args.widths is not None and args.crossover is None:
        ap.error("--widths is read against --crossover's recipe: give --crossover too")
    text = report(args.crossover, args.widths, args.scaling_law, args.baseline)
    print(text)
    if args.out:
        before = args.out.read_text().rstrip("\n") + "\n\n" if args.append and args.out.is_file() else ""
        write_record(args.out, before + text.rstrip("\n") + "\n", "records.crossover_size", args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
