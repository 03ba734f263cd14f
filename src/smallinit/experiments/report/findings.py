"""The report's lead: what the sweep measured, in a few sentences generated from its data, above
the claims. The best setting per size and its margin over the runner-up (stats.compare, paired
by seed, with its 95% interval), the best γ of each arm, what was not run with the one command
that runs it, and how the claims came out.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from smallinit.core import results_schema as schema
from smallinit.experiments.claims.claims import VERDICT, Claim
from smallinit.experiments.data.load import LOSS, Sweep
from smallinit.experiments.data.sweep_records import read_record
from smallinit.experiments.stats.stats import (
    A_HIGHER,
    A_LOWER,
    NOT_RUN,
    ONE_SEED,
    VERDICTS,
    WITHIN,
    Comparison,
    compare,
)

# The seeds a setting needs before a difference has an interval worth reading; the command
# offered when a sweep has fewer grows its seed axis to this many.
SEEDS_WANTED = 3
# Swept keys that set a seed; `seed` sets init.seed and train.seed together (conf/config.yaml).
SEED_KEYS = ("seed", "train.seed", "init.seed")
# A swept key with more values than this was sampled from an interval: not a grid to extend.
GRID_MAX_VALUES = 8
# Select-then-confirm: the folder's record (sweeper/config/protocol.py RECORD) and its override prefix.
PROTOCOL_RECORD, PROTOCOL = "protocol.json", "hydra.sweeper.protocol"


@dataclass
class Best:
    size: str
    variant: str
    loss: float
    seeds: int
    runner_up: str | None
    margin: Comparison | None  # runner-up minus best
    key: str = ""  # the best's `variant` value in the results (`variant` above is its label)

    def sentence(self) -> str:
        seeds = "one seed" if self.seeds == 1 else f"mean of {self.seeds} seeds"
        head = f"{self.variant} ({self.loss:.4f} nats, {seeds})"
        if self.runner_up is None:
            return f"{head}, the only setting run"
        return f"{head}, {margin_text(self.margin)} the runner-up {self.runner_up}"

    def as_dict(self) -> dict:
        return dict(size=self.size, variant=self.variant, loss=self.loss, seeds=self.seeds, runner_up=self.runner_up,
                    margin=None if self.margin is None else self.margin.as_dict())


def margin_text(c: Comparison) -> str:
    """'0.0123 nats (95% interval 0.0040 to 0.0206, paired over 3 seeds: beyond the seed spread) below'."""
    if c.n == 0:
        return "no seed in common with"
    if c.status == ONE_SEED:
        return f"{c.diff:.4f} nats (one seed: no interval) below"
    pairing = f"paired over {c.n} seeds" if c.paired else f"unpaired, {c.n} seeds a side"
    reading = {A_HIGHER: "beyond the seed spread", WITHIN: "within the seed spread",
               A_LOWER: "the runner-up is lower on the seeds both ran"}[c.status]
    return f"{c.diff:.4f} nats (95% interval {c.lo:.4f} to {c.hi:.4f}, {pairing}: {reading}) below"


def best_settings(df: pd.DataFrame, metric: str) -> list[Best]:
    """Per size, smallest first: the variant (γ and setting) with the lowest seed-mean loss, and
    its margin over the next lowest, paired by seed."""
    out = []
    # A sweep of one setting names variants by γ alone (its setting is in the scale table).
    one_setting = df["setting"].nunique() == 1
    label = {v: v.split(" | ")[0].replace("=", " = ") if one_setting else v for v in df["variant"].unique()}
    for size, g in sorted(df.groupby("size"), key=lambda kv: kv[1]["n_params"].min()):
        means = g.groupby("variant")[metric].mean().sort_values(kind="stable")
        best = str(means.index[0])
        rows = g[g["variant"] == best]
        runner_up = margin = None
        if len(means) > 1:
            runner_up = str(means.index[1])
            margin = compare(g[g["variant"] == runner_up], rows, metric)
            runner_up = label[runner_up]
        out.append(Best(str(size), label[best], float(means.iloc[0]), int(rows["seed"].nunique()), runner_up, margin, best))
    return out


# The standard init the paper compares against: what "the verdict against the baseline" means
# on a sweep of γ and ε (the main job's grid).
STANDARD = {"gamma": 0.5, "eps": 1e-5}


def standard_sentence(df: pd.DataFrame, best: list[Best], metric: str) -> str | None:
    """Per size whose best variant is not the standard init (γ 0.5, ε 1e-5) but which ran it:
    the best against the standard, paired by seed with its 95% interval, and what that says."""
    out = []
    for b in best:
        g = df[df["size"] == b.size]
        mask = np.isclose(g["gamma"].astype(float), STANDARD["gamma"])
        if "eps" in g:
            mask &= np.isclose(g["eps"].astype(float), STANDARD["eps"], rtol=1e-3)
        if "gate" in g and g["gate"].notna().any():
            mask &= g["gate"].fillna("none") == "none"
        standard = g[mask]
        if standard.empty or standard["variant"].nunique() != 1:
            continue
        best_rows = g[g["variant"] == b.key]
        if standard["variant"].iloc[0] in set(best_rows["variant"]):
            out.append(f"at {b.size} the standard init (γ = 0.5, ε = 1e-5) is itself the best")
            continue
        c = compare(standard, best_rows, metric)
        null = f": inconclusive, a difference beyond {max(abs(c.lo), abs(c.hi)):.4f} nats excluded" \
            if c.status == WITHIN and c.n >= 2 else ""
        out.append(f"at {b.size}, {b.variant} against the standard init (γ = 0.5, ε = 1e-5): {margin_text(c)} the "
                   f"standard{null}")
    return ("Against the baseline: " + "; ".join(out) + ".") if out else None


def best_gamma_sentence(best: pd.DataFrame) -> str | None:
    """Where the sweep has several arms that vary γ: which γ was lowest in how many of them."""
    swept = best[best["gammas"].map(len) > 1]
    if len(swept) < 2:
        return None
    several_sizes = swept["size"].nunique() > 1
    label = (swept["size"] + ", " + swept["setting"]) if several_sizes else swept["setting"]
    groups = swept.assign(label=label).groupby("best_gamma")["label"].apply(list).sort_index()
    if len(groups) == 1:
        ((gamma, labels),) = groups.items()
        return f"γ = {gamma:g} has the lowest loss in all {len(labels)} arms ({'; '.join(labels)})."
    parts = [f"γ = {g:g} in {len(labels)} ({'; '.join(labels)})" for g, labels in groups.items()]
    return "The best γ differs between arms: " + ", ".join(parts) + "."


def _fmt(v) -> str:
    """A swept value as an override writes it (0.5, 1e-05, 3, elementwise)."""
    if isinstance(v, float | np.floating):
        return repr(float(v))
    if isinstance(v, np.integer):
        return str(int(v))
    return str(v)


def seeds_command(sweep: Sweep) -> tuple[str | None, str]:
    """(the command that runs SEEDS_WANTED seeds of every setting, or None where the sweep's own
    command cannot be rebuilt; the seed override it adds). Built from the folder's record of its
    fixed overrides and the swept values of its results, so a rerun grows this folder's grid and
    skips every trial already done. A select-then-confirm folder (protocol.json) grows its
    confirm seeds instead: the protocol refuses a swept seed."""
    record = _protocol_record(sweep)
    if record is not None:
        return _protocol_command(sweep, record)
    res = sweep.results
    params = {k: res[c].dropna().unique() for k in schema.swept_keys(res) if (c := schema.analysis_column(k)) in res}
    key = next((k for k in SEED_KEYS if k in params), None)
    if key is not None:
        have = sorted(int(v) for v in params[key])
    else:
        seeds = set(zip(res["init_seed"].dropna().astype(int), res["train_seed"].dropna().astype(int)))
        same = {a for a, b in seeds if a == b}
        have, key = (sorted(same), "seed") if len(same) == len(seeds) and seeds else ([0], "seed")
    new = list(have)
    while len(new) < SEEDS_WANTED:
        new.append(max(new) + 1)
    seed_override = f"{key}={','.join(str(s) for s in new)}"
    fixed = _fixed_overrides(sweep, params, skip=(key,))
    if fixed is None:
        return None, seed_override
    swept = [f"{k}={','.join(_fmt(v) for v in sorted(vals, key=_order))}" for k, vals in params.items() if k != key]
    return _command([*fixed, *swept, seed_override], sweep), seed_override


def _fixed_overrides(sweep: Sweep, params: dict, skip: tuple[str, ...]) -> list[str] | None:
    """The folder's recorded fixed overrides; None for several folders, no record, or a swept
    key sampled from an interval (no grid to repeat)."""
    if len(sweep.dirs) != 1 or any(len(v) > GRID_MAX_VALUES for k, v in params.items() if k not in skip):
        return None
    record, _ = read_record(sweep.dirs[0], "fixed_overrides.json")  # a damaged one: named by load, no command
    fixed = (record or {}).get("fixed")
    return list(fixed.values()) if isinstance(fixed, dict) else None


def _command(args: list[str], sweep: Sweep) -> str:
    # Quoted for a shell: train.budgets=[512,1024] would otherwise be a glob.
    return " ".join(["python sweep.py -m", *map(shlex.quote, args), f"name={Path(sweep.dirs[0]).name}"])


def _protocol_record(sweep: Sweep) -> dict | None:
    """The first folder's protocol.json that exists: None where none has one, {} where it is damaged
    (load names it)."""
    for d in sweep.dirs:
        record, why = read_record(d, PROTOCOL_RECORD)
        if record is not None or why is not None:
            return record or {}
    return None


def _protocol_command(sweep: Sweep, record: dict) -> tuple[str | None, str]:
    """The sweep's command with its confirm seeds grown to SEEDS_WANTED (new seeds skip the
    tuning seeds). Its tuned keys keep the values the command gave: protocol.json records the
    values each setting tried, extensions included, and the command's are those every setting
    tried, where that accounts for each setting's extensions (else None: no command to give)."""
    confirm, tune_seeds = list(record.get("confirm_seeds", [])), list(record.get("tune_seeds", []))
    new, s = list(confirm), max(confirm, default=0)
    while len(new) < SEEDS_WANTED:
        s += 1
        if s not in tune_seeds:
            new.append(s)
    override = f"{PROTOCOL}.confirm_seeds=[{','.join(str(x) for x in new)}]"
    tune, seed_key = list(record.get("tune", [])), record.get("seed_key", "seed")
    res = sweep.results
    params = {k: res[c].dropna().unique() for k in schema.swept_keys(res) if (c := schema.analysis_column(k)) in res}
    grid = _command_grid(record)
    fixed = _fixed_overrides(sweep, params, skip=(seed_key, *tune))
    if grid is None or fixed is None or not tune:
        return None, shlex.quote(override)
    swept = [f"{k}={','.join(_fmt(v) for v in sorted(vals, key=_order))}" for k, vals in params.items()
             if k != seed_key and k not in tune]
    tuned = [f"{k}={','.join(_fmt(v) for v in grid[k])}" for k in tune]
    protocol = [f"{PROTOCOL}.tune=[{','.join(tune)}]", f"{PROTOCOL}.tune_seeds=[{','.join(map(str, tune_seeds))}]",
                override, f"{PROTOCOL}.max_extensions={record.get('max_extensions', 2)}",
                *([f"{PROTOCOL}.seed_key={seed_key}"] if seed_key != "seed" else [])]
    return _command([*fixed, *swept, *tuned, *protocol], sweep), shlex.quote(override)


def _command_grid(record: dict) -> dict[str, list] | None:
    """Per tuned key, the values the command gave: those every setting tried. Exact when each
    setting tried exactly its extensions more (an extension every setting made would otherwise
    pass for a value of the command's); None where not."""
    choices, tune = record.get("choices", []), record.get("tune", [])
    if not choices or not tune:
        return None
    try:
        grid = {k: sorted(set.intersection(*(set(c["tried"][k]) for c in choices))) for k in tune}
        extra = [sum(len(c["tried"][k]) - len(grid[k]) for k in tune) for c in choices]
        ok = all(n == c["extensions"] for n, c in zip(extra, choices))
    except (KeyError, TypeError):
        return None
    return grid if ok and all(len(v) >= 2 for v in grid.values()) else None


def _order(v):
    return (0, float(v), "") if isinstance(v, int | float | np.number) else (1, 0.0, str(v))


def not_run_sentence(sweep: Sweep, df: pd.DataFrame, claims: list[Claim]) -> tuple[str, str | None]:
    """What was not run, and the one command that runs it (None where there is none to give)."""
    fewest = int(df.groupby(["size", "setting", "gamma"])["seed"].nunique().min())
    if fewest < SEEDS_WANTED:
        command, override = seeds_command(sweep)
        if fewest == 1:
            what = "more than one seed per setting, so no difference has an interval"
        else:  # the t-interval's half-width in standard errors, at these seeds and at SEEDS_WANTED
            t_now, t_want = (float(student_t.ppf(0.975, k - 1)) for k in (fewest, SEEDS_WANTED))
            what = (f"more than {fewest} seeds per setting, and with {fewest} a 95% interval spans ±{t_now:.1f} "
                    f"standard errors (±{t_want:.1f} with {SEEDS_WANTED})")
        if command:
            return (f"Not run: {what}. This command adds seeds up to {SEEDS_WANTED} and skips every trial already "
                    f"done: {command}"), command
        return f"Not run: {what}. Rerun the sweep's command with {override} to add them.", None
    missing = [c.claim for c in claims if c.kind == VERDICT and c.verdict == NOT_RUN]
    if missing:
        return (f"Not run: {len(missing)} of the paper's claims have no arms here ({'; '.join(missing)}); the table "
                "says what each needs."), None
    return "Every claim had arms to compare.", None


def claims_sentence(claims: list[Claim]) -> str:
    verdicts = [c.verdict for c in claims if c.kind == VERDICT]
    counts = [f"{verdicts.count(v)} {v}" for v in VERDICTS if verdicts.count(v)]
    return f"The paper's claims, below: {', '.join(counts)}."


def lead(sweep: Sweep, df: pd.DataFrame, best_gamma: pd.DataFrame, claims: list[Claim], metric: str) -> tuple[list[str], dict]:
    """The lead's sentences, in order, and its part of summary.json."""
    best = best_settings(df, metric)
    what = "final validation loss" if metric == LOSS else "best validation loss"
    if len(best) == 1:
        first = f"Lowest {what} at {best[0].size}: {best[0].sentence()}."
    else:
        first = f"Lowest {what} per size: " + "; ".join(f"{b.size}: {b.sentence()}" for b in best) + "."
    not_run, command = not_run_sentence(sweep, df, claims)
    sentences = [s for s in (first, standard_sentence(df, best, metric), best_gamma_sentence(best_gamma), not_run,
                             claims_sentence(claims)) if s]
    return sentences, dict(sentences=sentences, best=[b.as_dict() for b in best], command=command)
