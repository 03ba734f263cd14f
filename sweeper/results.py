"""The results table: `results.parquet` in the sweep folder, one row per trial.

Built from what the trials wrote (trial.json, result.json, failure.json) and the study's
states, so it can always be rebuilt and never drops a finished trial. Written atomically.
Columns are documented in README.md ("The results table").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from core.files import atomic_write

if TYPE_CHECKING:
    from .study import Study

PROBE_SUMMARIES = ("attn_sink/mean", "stable_rank/mean", "row_cosine/mean", "saturation/mean", "residual_ratio/mean")


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def trial_row(trial_dir: Path, study_state: dict[str, Any] | None = None) -> dict[str, Any] | None:
    meta = _read(trial_dir / "trial.json")
    sweep = _read(trial_dir / "sweep.json") or {}
    if meta is None and "config" in sweep:  # planned, but its worker never started training
        meta = {"identity": sweep["identity"], "config": sweep["config"]}
    if meta is None:
        return None
    cfg = meta["config"]
    model, train = cfg["model"], cfg["train"]
    result, failure = _read(trial_dir / "result.json"), _read(trial_dir / "failure.json")
    study_state = study_state or {}
    if result is not None:
        state = "COMPLETE"
    elif failure is not None:
        state = "FAIL"
    else:
        state = study_state.get("state") or "INTERRUPTED"
        if state == "RUNNING":
            state = "INTERRUPTED"
    row: dict[str, Any] = {
        "trial_number": study_state.get("number"),
        "identity": meta["identity"],
        "state": state,
        "fail_reason": (failure or {}).get("reason") or study_state.get("fail_reason"),
        **{f"param.{k}": v for k, v in sweep.get("params", {}).items()},
        "model": cfg.get("preset"),
        "n_params": None,
        "d_model": model["d_model"],
        "n_layers": model["n_layers"],
        "gamma": model["init"]["gamma"],
        "init_seed": model["init"]["seed"],
        "eps": model["norm"]["eps"],
        "norm": model["norm"]["type"],
        "gate": model["attn"]["gate"],
        "ffn": model["ffn"]["type"],
        "task": cfg["data"].get("task", "lm"),
        "train_seed": train["seed"],
        "lr": cfg["optim"]["lr"],
        "weight_decay": cfg["optim"]["weight_decay"],
        "dtype": None,
        "tokens": None,
        "final_val_loss": None,
        "best_val_loss": None,
        "unigram_entropy": None,
        "wall_s": None,
        "tokens_per_s": None,
        "mfu": None,
        "node_id": ((_read(trial_dir / "placement.json") or [{}])[-1]).get("node_id"),
        "attempts": len(_read(trial_dir / "placement.json") or []),
        "trial_dir": str(trial_dir),
        "metrics_path": str(trial_dir / "metrics.jsonl"),
        "per_token_losses_path": None,
        "probes_dir": str(trial_dir / "probes"),
    }
    if result is not None:
        final = result.get("final_metrics", {})
        row.update(
            n_params=result["n_params"], tokens=result["tokens"], final_val_loss=result["final_val_loss"],
            best_val_loss=result["best_val_loss"], unigram_entropy=result["unigram_entropy"], wall_s=result["wall_s"],
            tokens_per_s=result["tokens_per_s"], mfu=result["mfu"], dtype=result.get("dtype"),
            per_token_losses_path=result["artifacts"].get("per_token_losses") or None,
        )
        for key in PROBE_SUMMARIES:
            row[key.replace("/mean", "")] = final.get(key)
        for key, value in final.items():
            if key.startswith("anchor/"):
                row[key.replace("/", "_")] = value
    elif state == "PRUNED":
        last = _last_metrics(trial_dir / "metrics.jsonl")
        row.update(final_val_loss=last.get("val/loss"), best_val_loss=last.get("val/best_loss"), tokens=last.get("tokens"))
    return row


def _last_metrics(path: Path) -> dict[str, Any]:
    last: dict[str, Any] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                last.update({k: v for k, v in json.loads(line).items() if v is not None})
    return last


def build_table(sweep_dir: Path, study_states: dict[str, dict[str, Any]] | None = None) -> pd.DataFrame:
    """One row per trial, in trial-number order: every trial folder under sweep_dir/trials,
    plus the study's trials whose folders live elsewhere (a study shared between sweep
    folders), each identity once."""
    study_states = study_states or {}
    trials_dir = Path(sweep_dir) / "trials"
    dirs = {p.name: p for p in sorted(trials_dir.iterdir())} if trials_dir.exists() else {}
    for ident, state in study_states.items():
        if ident not in dirs and state.get("trial_dir"):
            dirs[ident] = Path(state["trial_dir"])
    rows = [row for ident, d in dirs.items() if (row := trial_row(d, study_states.get(ident))) is not None]
    df = pd.DataFrame(rows)
    if not df.empty:
        df = df.sort_values("trial_number", na_position="last", kind="stable").reset_index(drop=True)
    return df


def write_table(sweep_dir: Path, df: pd.DataFrame) -> Path:
    path = Path(sweep_dir) / "results.parquet"
    atomic_write(path, lambda f: df.to_parquet(f, index=False))
    return path



def write_results(sweep_dir: Path, study: Study) -> pd.DataFrame:
    """Rebuild and write the table from the trial folders and the study; print the counts
    and the best trial."""
    states = {
        ident: {"number": t.number, "state": t.state.name, "fail_reason": t.user_attrs.get("fail_reason"),
                "trial_dir": t.user_attrs.get("trial_dir")}
        for ident, t in study.by_identity().items()
    }
    df = build_table(sweep_dir, states)
    path = write_table(sweep_dir, df)
    counts = df["state"].value_counts().to_dict() if not df.empty else {}
    print(f"results: {path} ({', '.join(f'{v} {k.lower()}' for k, v in counts.items()) or 'no trials'})")
    done = df[df["state"] == "COMPLETE"].dropna(subset=["final_val_loss"]) if not df.empty else df
    if not done.empty:
        best = done.loc[done["final_val_loss"].idxmin()]
        params = {c.removeprefix("param."): best[c].item() if hasattr(best[c], "item") else best[c]
                  for c in df.columns if c.startswith("param.")}
        print(f"best: trial {int(best['trial_number'])} {params} val loss {best['final_val_loss']:.4f} -> {best['trial_dir']}")
    return df
