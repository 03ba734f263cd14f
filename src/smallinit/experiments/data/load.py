"""Read sweeps into frames: the results table and what the analysis compares (a trial's own
files, metrics, probes and per-token losses, are read by trial_files.py).

Vocabulary used by every module of the report:

    setting       what a trial is, apart from its size, gamma and seeds: (eps, gate, norm, ...)
    gamma curve   (size, setting): one curve of loss against gamma, whose best gamma is picked
    variant       (gamma, setting): what the effective-size fit compares across sizes
    seed          (init_seed, train_seed): variants are compared paired by seed

(An `arm` is something else: a recipe in conf/arm/, swept as the key `arm`.)

Only COMPLETE trials enter the analysis; the others are counted in the scale table. Where the
sweep ran select-then-confirm (a `role` column), only role=confirm trials are compared
(tuning.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from smallinit.core import results_schema as schema
from smallinit.core.trial_dir import TrialDir, unusable

from .sweep_records import ReportError, Table, damaged_records, read_table_once
from .tuning import OPTIM_COLS, Tuning, tune

SIZE_COLS = ("model", "d_model", "n_layers")
SEED_COLS = ("init_seed", "train_seed")
# Always part of a setting (labels read better with them), whether or not they vary.
BASE_SETTING_COLS = ("eps", "gate", "norm")
# Part of a setting only where they vary within the sweep. The optimiser's lr and weight decay
# are not: they are tuned per setting (experiments/data/tuning.py), the init is what is compared.
# dtype (what train.dtype=auto resolved to) varies where a cluster mixes CPUs with and without
# native bf16: a bf16 trial follows its own trajectory, so trials are compared within a dtype.
EXTRA_SETTING_COLS = ("ffn", "task", "tokens", "dtype")
# Swept keys already represented by a resolved column (or by size, gamma, seeds): `seed` sets
# init.seed and train.seed together, `arm` sets gamma, eps and gate together. train.stop_after
# is where a confirm run ends (hydra.sweeper.protocol.confirm_to_chosen): its rows are the
# budgets it trained, each the whole run's branch, so it is not a setting.
KNOWN_PARAMS = {
    "init.gamma", "seed", "arm", "init.seed", "train.seed", "norm.eps", "norm", "norm.type", "attn", "attn.gate",
    "model", "model.d_model", "model.n_layers", "optim.lr", "optim.weight_decay", "train.max_tokens", "ffn", "ffn.type",
    "train.dtype", "train.stop_after", *schema.SHORT_NAMES.values(),
}
LOSS = schema.FINAL_VAL_LOSS


@dataclass
class Sweep:
    """One or more sweep folders read together."""

    dirs: list[Path]
    results: pd.DataFrame  # every row of every results.parquet, with a `sweep` column
    complete: pd.DataFrame  # COMPLETE rows with a finite loss, labelled, at each cell's best lr (tuning.py)
    setting_cols: list[str]
    tuning: Tuning
    left_out: list[str] = field(default_factory=list)  # finished trials whose files changed since: one line each
    # each folder's table as read (the rows and sha256 a record quotes: one read, see Table)
    tables: list[Table] = field(default_factory=list)
    damaged_records: list[str] = field(default_factory=list)  # a folder's own records that cannot be read: one line each

    @property
    def name(self) -> str:
        return "+".join(d.name for d in self.dirs)


# The main job's sweep: `make sweep` runs sweep.py's default name (sweeper/config/schema.py's
# SmallinitConf.name), so it writes sweeps/smallinit/ (tests/test_report.py holds the two equal).
MAIN_SWEEP = "smallinit"


def newest_sweep(root: Path = Path("sweeps")) -> Path:
    candidates = [p.parent for p in Path(root).glob(f"*/{schema.RESULTS_FILE}")]
    if not candidates:
        raise ReportError(f"no sweep found: no {root}/*/results.parquet (run `make sweep` first, or pass SWEEP=<folder>)")
    return max(candidates, key=lambda p: os.path.getmtime(schema.results_path(p)))


def default_sweep(root: Path = Path("sweeps")) -> tuple[Path, str]:
    """The sweep a report without --sweep is of, and a line saying which and why: the main
    job's (root/smallinit, what `make sweep` writes) when it has a results table, else the newest."""
    main = Path(root) / MAIN_SWEEP
    if schema.results_path(main).exists():
        return main, f"{main} (the main job's, `make sweep`; SWEEP=<folder> for another)"
    newest = newest_sweep(root)
    return newest, f"{newest}, the newest sweep (no {main}/results.parquet; SWEEP=<folder> for another)"


def resolve_dirs(spec: str | None, root: Path = Path("sweeps")) -> list[Path]:
    """`a,b` -> [Path(a), Path(b)]; a bare name also resolves under root; None -> default_sweep's."""
    if not spec:
        return [default_sweep(root)[0]]
    dirs = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        path = Path(part)
        if not path.exists() and (root / part).exists():
            path = root / part
        if not path.is_dir():
            raise ReportError(f"sweep folder {part!r} does not exist")
        if not schema.results_path(path).exists():
            raise ReportError(f"{path}/results.parquet is missing: the sweep has not finished (rerun its command to rebuild it)")
        dirs.append(path)
    if not dirs:
        raise ReportError(f"--sweep {spec!r} names no folder")
    return dirs


def _fmt_eps(v) -> str:
    return f"{v:.0e}".replace("e-0", "e-") if isinstance(v, float) and np.isfinite(v) else str(v)


def format_value(col: str, v) -> str:
    if col == "eps":
        return _fmt_eps(v)
    if col == "lr":
        return f"{v:g}"
    if col == "tokens":
        return f"{int(v):,}"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _extra_params(df: pd.DataFrame) -> list[str]:
    """Swept keys not covered by a resolved column and with few values (a grid axis)."""
    out = []
    for key in schema.swept_keys(df):
        col = schema.analysis_column(key)
        if key not in KNOWN_PARAMS and col in df and 1 < df[col].nunique(dropna=False) <= 8:
            out.append(col)
    return out


def load_report(dirs: list[Path], metric: str = LOSS) -> tuple[Sweep, Sweep | None]:
    """(the sweep every section reads, the sweep with every budget's rows or None). With
    train.budgets a trial has a row per budget: the sections read its largest, the whole run
    (which logged the curves, probes and per-token losses; the others are cooldown branches),
    and only the L(N, D) fit and the crossover read them all (budgets.py)."""
    every = load(dirs, metric)
    if not has_branches(every.results):
        return every, None
    return load(dirs, metric, budgets="largest"), every


def has_branches(results: pd.DataFrame) -> bool:
    """Some trial has rows at more than one token budget (train.budgets)."""
    if schema.BUDGET_TOKENS not in results or schema.TRIAL_IDENTITY not in results or results[schema.BUDGET_TOKENS].isna().all():
        return False
    return bool((results.groupby(schema.TRIAL_IDENTITY)[schema.BUDGET_TOKENS].nunique() > 1).any())


def load(dirs: list[Path], metric: str = LOSS, budgets: str = "all") -> Sweep:
    """budgets="largest": of a trial with several budgets, only its largest budget's row."""
    frames, tables = [], [read_table_once(d) for d in dirs]
    for d, table in zip(dirs, tables):
        df = table.local(short_names=True)
        if schema.IDENTITY in df:
            df = df.drop_duplicates(schema.IDENTITY, keep="first")
        frames.append(df.assign(sweep=d.name))
    results = pd.concat(_each_trial_once(frames, dirs), ignore_index=True) if frames else pd.DataFrame()
    if results.empty:
        raise ReportError(f"{', '.join(str(d) for d in dirs)}: results.parquet has no trials")
    left_out = hold_to_their_files(results)
    damaged = damaged_records(dirs)
    if budgets == "largest" and has_branches(results):
        largest = results.groupby(schema.TRIAL_IDENTITY)[schema.BUDGET_TOKENS].transform("max")
        keep = results[schema.BUDGET_TOKENS].isna() | largest.isna() | (results[schema.BUDGET_TOKENS] == largest)
        results = results[keep].reset_index(drop=True)
    for col in (*SIZE_COLS, *SEED_COLS, *BASE_SETTING_COLS, *EXTRA_SETTING_COLS, *OPTIM_COLS, "gamma", "n_params", metric,
                schema.STATE, schema.FAIL_REASON, "unigram_entropy", "attn_sink", "saturation", "residual_ratio", "wall_s", "dtype", "corpus_tokens"):
        if col not in results:
            results[col] = np.nan
    if metric not in results:
        raise ReportError(f"results have no column {metric!r}")
    done = results[(results[schema.STATE] == schema.COMPLETE) & np.isfinite(pd.to_numeric(results[metric], errors="coerce"))].copy()
    if done.empty:
        states = results[schema.STATE].value_counts().to_dict()
        raise ReportError(f"no COMPLETE trial with a finite {metric} in {', '.join(str(d) for d in dirs)} (states: {states})")
    done[metric] = done[metric].astype(float)
    for col in SEED_COLS:
        done[col] = done[col].fillna(0).astype(int)
    # A size is the model's shape; options that add parameters at that shape (the elementwise
    # gate's W_theta) do not make it another size. Its label counts the smallest variant's
    # parameters; the effective-size fit still uses each trial's own count.
    shape = done[list(SIZE_COLS)].astype(str).agg("/".join, axis=1)
    done["size"] = done.assign(n_params=done.groupby(shape)["n_params"].transform("min")).apply(size_label, axis=1)
    # A key that varies only together with the size (a token budget scaled per size, say)
    # belongs to the size; one that varies within a size splits gamma curves.
    setting_cols = list(BASE_SETTING_COLS)
    setting_cols += [c for c in [*EXTRA_SETTING_COLS, *_extra_params(done)]
                     if done.groupby("size")[c].nunique(dropna=False).max() > 1]
    # Labels name only what varies (the scale table lists the rest); a sweep of one setting
    # keeps the full label.
    label_cols = [c for c in setting_cols if done[c].nunique(dropna=False) > 1] or setting_cols
    done["setting"] = done.apply(lambda r: setting_label(r, label_cols), axis=1)
    done["gamma_curve"] = done["size"] + " | " + done["setting"]
    done["variant"] = "γ=" + done["gamma"].map(lambda g: f"{g:g}") + " | " + done["setting"]
    done["seed"] = done["init_seed"].astype(str) + "/" + done["train_seed"].astype(str)
    try:
        tuned, tuning = tune(done.reset_index(drop=True), metric, results)
    except ValueError as e:  # a role value other than tune/confirm
        raise ReportError(str(e)) from None
    if tuned.empty:
        raise ReportError(f"{', '.join(str(d) for d in dirs)}: no role=confirm trial at a chosen setting yet "
                          "(select-then-confirm: rerun the sweep's command to run the confirm stage)")
    return Sweep(dirs=list(dirs), results=results, complete=tuned.reset_index(drop=True), setting_cols=setting_cols,
                 tuning=tuning, left_out=left_out, damaged_records=damaged, tables=tables)


def hold_to_their_files(results: pd.DataFrame) -> list[str]:
    """A COMPLETE row whose trial folder no longer holds what the trial left (a file it lists
    changed, or result.json itself, or result.json gone: core/trial_files.py) becomes FAIL with
    the reason, in place: it is left out of every verdict, and the report says so (one line each,
    returned). A table read where its trials' folders are not (a committed record's copy) keeps
    its rows as recorded."""
    if "trial_dir" not in results or schema.STATE not in results:
        return []
    lines, seen = [], {}
    results[schema.FAIL_REASON] = results[schema.FAIL_REASON].astype(object) if schema.FAIL_REASON in results else None
    for i in results.index[results[schema.STATE] == schema.COMPLETE]:
        stored = results.at[i, "trial_dir"]
        if not isinstance(stored, str) or not Path(stored).is_dir():
            continue
        folder = TrialDir(stored)
        identity = results.at[i, schema.IDENTITY] if schema.IDENTITY in results else None
        budget = results.at[i, schema.BUDGET_TOKENS] if isinstance(identity, str) and schema.BUDGET_SEP in identity else None
        # A finished trial is checked once for all its rows (its result.json lists every branch file);
        # a budget row of a trial still training, on its own branch file.
        key = (stored, None if folder.finished or budget is None or pd.isna(budget) else int(budget))
        if key not in seen:
            seen[key] = _why_left_out(folder, key[1])
            if seen[key] is not None:
                lines.append(f"trial {folder.path.name} left out of every verdict: {seen[key]}; rerun the sweep's "
                             "command to train it again")
        if seen[key] is not None:
            results.at[i, schema.STATE] = schema.FAIL
            results.at[i, schema.FAIL_REASON] = seen[key]
    return lines


def _why_left_out(folder: TrialDir, budget: int | None) -> str | None:
    """Why a row the table calls COMPLETE cannot be reported from its folder; None when it can. A
    budget row of a trial still training stands on its branch's budgets/<tokens>.json."""
    if folder.finished:
        why = folder.damaged_result()
        return None if why is None else f"{folder.result_json} is {unusable(why)}"
    record = folder.result_json if budget is None else folder.budget_json(budget)
    if not record.exists():
        return f"{record} is missing (moved or deleted since the table was written)"
    why = folder.damaged_budget(budget)
    return None if why is None else f"{record} is {unusable(why)}"


def trial_identities(df: pd.DataFrame) -> list[str | None]:
    """Each row's trial identity: `trial_identity`, else `identity` less its @<budget_tokens>."""
    if schema.TRIAL_IDENTITY in df:
        ids = df[schema.TRIAL_IDENTITY]
    elif schema.IDENTITY in df:
        ids = df[schema.IDENTITY].map(lambda v: schema.trial_identity(v) if isinstance(v, str) else None)
    else:
        return [None] * len(df)
    return [v if isinstance(v, str) and v else None for v in ids]


def _each_trial_once(frames: list[pd.DataFrame], dirs: list[Path]) -> list[pd.DataFrame]:
    """Every sweep's rows, labelled by its `sweep`, each trial in one sweep only. One trial
    folder that two sweeps' tables both list (a study shared between folders reuses a finished
    trial) is the same run: its rows stay with the first sweep that lists it. The same identity
    trained in two folders is one setting run twice: counted in both it would weigh double in
    every comparison, so it is refused in one line rather than either copy dropped unseen."""
    seen: dict[str, tuple[Path, Path | None]] = {}  # trial identity -> (its sweep, its trial folder)
    out = []
    for d, df in zip(dirs, frames):
        ids = trial_identities(df)
        folders = [_folder(v) for v in (df["trial_dir"] if "trial_dir" in df else [None] * len(df))]
        mine: dict[str, tuple[Path, Path | None]] = {}
        keep, twice = [], []
        for ident, folder in zip(ids, folders):
            if ident is None or ident not in seen:
                keep.append(True)
                if ident is not None:
                    mine.setdefault(ident, (d, folder))
                continue
            other, other_folder = seen[ident]
            keep.append(False)
            if folder is None or folder != other_folder:
                twice.append((ident, other))
        if twice:
            ident, other = twice[0]
            more = len({i for i, _ in twice}) - 1
            raise ReportError(
                f"trial {ident}{f' (and {more} more)' if more else ''} is in both {other} and {d}, trained in each: "
                f"reported together it would be counted twice; report them one at a time (SWEEP={other}, then "
                f"SWEEP={d}), or together only sweeps whose grids share no setting (python -m smallinit.experiments.data.compare {other} {d} counts them)")
        seen.update(mine)
        out.append(df[keep])
    return out


def _folder(stored) -> Path | None:
    return Path(stored).resolve() if isinstance(stored, str) and stored else None


def size_label(row) -> str:
    n = row.get("n_params")
    n_txt = f"{n / 1e6:.2f}M" if isinstance(n, int | float | np.integer | np.floating) and np.isfinite(n) else "?"
    return f"{row.get('model')} (d={int(row['d_model'])}, L={int(row['n_layers'])}, {n_txt})"


def setting_label(row, cols: list[str]) -> str:
    return ", ".join(f"{c.removeprefix(schema.CONFIG_PREFIX)}={format_value(c, row[c])}" for c in cols)


NUMERIC = ("gamma", "eps", "lr", "weight_decay", "tokens", "n_params", "d_model", "n_layers", "init_seed", "train_seed")


def select(df: pd.DataFrame, spec: str) -> pd.Series:
    """Rows matching 'gamma=1,eps=1e-12,gate=elementwise' (numbers compared with a tolerance)."""
    mask = pd.Series(True, index=df.index)
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if "=" not in part:
            raise ReportError(f"arm selector {spec!r}: {part!r} is not key=value")
        key, value = (s.strip() for s in part.split("=", 1))
        col = key if key in df else schema.analysis_column(key) if schema.analysis_column(key) in df else None
        if col is None:
            raise ReportError(f"arm selector {spec!r}: no column {key!r} (try gamma, eps, gate, norm, model)")
        if key in NUMERIC:
            try:
                target = float(value)
            except ValueError:
                raise ReportError(f"arm selector {spec!r}: {key}={value!r} is not a number") from None
            mask &= np.isclose(df[col].astype(float), target, rtol=1e-6, atol=0)
        else:
            mask &= df[col].astype(str) == value
    return mask


def variant_of(df: pd.DataFrame, spec: str) -> str:
    """The one variant (gamma, setting) that a selector picks."""
    found = sorted(df[select(df, spec)]["variant"].unique())
    if len(found) != 1:
        listing = "; ".join(sorted(df["variant"].unique()))
        raise ReportError(f"arm selector {spec!r} matches {len(found)} variants ({'; '.join(found) or 'none'}); "
                          f"name one of: {listing}")
    return found[0]


GATE_PREFERENCE = {"elementwise": 0, "headwise": 1, "none": 2}


def recipe_variant(df: pd.DataFrame, baseline_variant: str | None) -> str | None:
    """The paper's recipe as far as the sweep has it: gamma nearest 1, the smallest eps, a gate
    if any, the baseline's norm; None if that is the baseline itself."""
    if df.empty:
        return None
    base = df[df["variant"] == baseline_variant]
    cand = df[df["variant"] != baseline_variant]
    if not base.empty and (cand["norm"] == base["norm"].iloc[0]).any():
        cand = cand[cand["norm"] == base["norm"].iloc[0]]
    if cand.empty:
        return None
    gap = (cand["gamma"] - 1.0).abs()
    cand = cand[np.isclose(gap, gap.min())]
    cand = cand[np.isclose(cand["eps"], cand["eps"].min())]
    cand = cand.assign(_g=cand["gate"].map(GATE_PREFERENCE).fillna(3))
    cand = cand[cand["_g"] == cand["_g"].min()]
    return str(cand["variant"].value_counts().index[0])
