"""Hold each trial against its corpus before anything launches.

    prepared = check_trials(trials)     # prepares each distinct corpus once, checks every trial

A trial fits its corpus when the corpus has one training sequence and one validation window,
and its budget takes at most `train.max_epochs` passes over the training tokens. The sweep
driver runs this before it writes the study or a trial folder (sweeper/driver.py), a plain run
before it trains (sweep.py): a mistake is one line naming the key, the value and what is
allowed. Needs no torch.
"""

from __future__ import annotations

from collections.abc import Iterable

from smallinit.core.errors import ConfigError, first_line, require
from smallinit.data.config import CorpusData
from smallinit.data.pipeline import PreparedData, prepare

from .config import TrialConfig

RECIPE = ("bring a larger corpus (python -m smallinit.data.make_shards TEXT_DIR OUT_DIR, then "
          "data=tokens data.paths=OUT_DIR; README, GPU runs)")


def passes(trial: TrialConfig, prepared: PreparedData) -> float:
    """Budget tokens / the corpus's training tokens: how often the trial sees each token."""
    t = trial.train
    return t.total_steps * t.tokens_per_step / prepared.n_train_tokens


def describe(data: CorpusData) -> str:
    return "data=bilingual" if data.corpus == "bilingual" else f"data={data.corpus} data.paths={list(data.paths)}"


def check_trial(trial: TrialConfig, prepared: PreparedData) -> float:
    """Raise ConfigError unless the trial fits its prepared corpus; return its passes."""
    t, where = trial.train, describe(trial.data)
    need = t.seq_len + 1
    require(prepared.n_train_tokens >= need, "data.paths", list(trial.data.paths),
            f"{prepared.n_train_tokens} training token(s) in {where}, fewer than one sequence "
            f"(train.seq_len + 1 = {need})")
    for key in ("eval_tokens", "per_token_eval_tokens"):
        wanted = getattr(t, key)
        if wanted:  # val_batches scores windows of seq_len tokens plus one target
            require(wanted >= t.seq_len, f"train.{key}", wanted, f"0 or >= train.seq_len ({t.seq_len})")
            require(prepared.n_val_tokens >= need, "data.paths", list(trial.data.paths),
                    f"{prepared.n_val_tokens} validation token(s) in {where}, fewer than one window "
                    f"(train.seq_len + 1 = {need}); add text or raise data.val_fraction")
    p = passes(trial, prepared)
    if t.max_epochs is not None and p > t.max_epochs:
        raise ConfigError(
            f"train.max_epochs={t.max_epochs} is invalid for this budget: {t.total_steps * t.tokens_per_step:,} "
            f"tokens per trial is {p:,.1f} passes over the {prepared.n_train_tokens:,} training tokens of "
            f"{where}; {RECIPE}, lower the budget (train.max_tokens, train.tokens_per_param) or raise "
            f"train.max_epochs")
    return p


def check_trials(trials: Iterable[TrialConfig], log=print) -> dict[CorpusData, PreparedData]:
    """Prepare each distinct corpus once (a cache hit after the first time) and check every
    trial against it. The anchor task has no corpus and is not checked."""
    prepared: dict[CorpusData, PreparedData] = {}
    for trial in trials:
        data = trial.data
        if not isinstance(data, CorpusData):
            continue
        if data not in prepared:  # frozen: hashable, equal by value
            try:
                prepared[data] = prepare(data, log=log)
            except OSError as e:  # unreadable input, or a cache folder we cannot write
                in_cache = e.filename is not None and str(e.filename).startswith(str(data.cache_path))
                key, value = ("data.cache_dir", data.cache_dir) if in_cache else ("data.paths", list(data.paths))
                raise ConfigError(f"{key}={value!r} is invalid: {first_line(e)}") from None
        check_trial(trial, prepared[data])
    return prepared
