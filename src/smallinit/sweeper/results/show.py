"""`python sweep.py --show [-m] OVERRIDES`: what each trial would get, before anything runs.

Hydra's `--cfg job` prints the config as composed, where the model's shape fields are null
(the preset fills them when the trial is built) and the launcher reads BasicLauncher although
sweeps run on Ray. This prints the trial as it will train: the preset's shape filled in, the
data and budget resolved, its identity, how it would run, and how long it would take here
(sweeper/results/estimate.py: the first trial's model timed for a few seconds on this CPU).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from smallinit.data.config import CorpusData
from smallinit.sweeper.config import protocol
from smallinit.sweeper.config.config import ProtocolConf
from smallinit.sweeper.config.points import PointComposer
from smallinit.sweeper.config.space import parse_sweep
from smallinit.sweeper.runtime.resources import trial_workers
from smallinit.trainer.config import TrialConfig, flops_per_token, trial_config_from_dict
from smallinit.trainer.data_check import check_trial, describe, passes
from smallinit.trainer.schedule import budget_branches

from . import estimate

CHILD_TIMEOUT_S = 300  # a child that has not answered by then is killed and the lines made here


def show(argv: list[str], conf_dir: Path) -> Iterator[str]:
    """The lines to print, each as soon as it is known: the first trial in full, one line per
    trial as it is built, then what needs them all (memory per shape, cost). The memory lines
    need torch and a trace on the meta device, which imports torch._dynamo (together ~5 s of
    CPU): a child process started first does that while this one composes the points."""
    child = _torch_side()
    try:
        yield from _show(argv, conf_dir, child)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _show(argv: list[str], conf_dir: Path, child: subprocess.Popen) -> Iterator[str]:
    multirun = "-m" in argv or "--multirun" in argv
    lines = [a for a in argv if not a.startswith("-")]
    # The experiment and the sweeper's own settings shape the sweep; the rest are its overrides.
    sweep_settings = [a for a in lines if "experiment" in a.split("=", 1)[0] or a.startswith("hydra.sweeper.")]
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        base = compose("config", overrides=sweep_settings, return_hydra_config=True)
        params = _container(base.hydra.sweeper.params) if multirun else {}
        space = space_given = parse_sweep([a for a in lines if not a.startswith("hydra.sweeper.")], params)
        pconf = ProtocolConf(**_container(base.hydra.sweeper.get("protocol")))
        if multirun and pconf.enabled:
            protocol.check(pconf, space, asha=bool(base.hydra.sweeper.asha.enabled))
            # What stage 1 runs first: each setting at every tuned value on the tuning seeds.
            points = [{**s, pconf.seed_key: seed} for s in space.grid() for seed in pconf.tune_seeds]
            space = protocol.round_space(space, points)
        points = space.grid() if space.mode == "grid" else [{}]
        loader = GlobalHydra.instance().config_loader()
        composer = PointComposer(lambda overrides: compose("config", overrides=overrides, return_hydra_config=True),
                                 lambda path: loader.repository.group_exists(path))
        trials, runs_on, threads = [], [], []
        for point in points:
            cfg = composer.job(space.overrides_for(point))
            trial = trial_config_from_dict(cfg)
            trials.append(trial)
            ray_cfg = cfg.get("ray") or {}
            runs_on.append((trial_workers(trial, ray_cfg), float(ray_cfg.get("gpus_per_trial") or 0) > 0))
            # A sweep's trial runs on ray.cpus_per_trial threads; one run here, on train.threads.
            threads.append(int(ray_cfg.get("cpus_per_trial") or 1) if multirun else trial.train.threads)
            if len(trials) == 1:
                yield from _first(trial, runs_on[0][0] if multirun else 1, multirun, space, len(points))
            if multirun:
                yield f"#   {trial.identity(runs_on[-1][0])}  " + " ".join(f"{k}={v}" for k, v in point.items())
    why = estimate.not_measured(trials[0], *runs_on[0])
    lines, rate = _torch_answers(trials, runs_on, child, None if why else (trials[0], threads[0]))
    yield from lines
    timing = f"# estimated time: not measured ({why or rate})" if why or isinstance(rate, str) else None
    if not multirun:
        yield timing or estimate.line(rate, [_seconds(rate, trials[0])], None, None)
        yield "# runs here, in this process (python sweep.py ...)"
        return
    if pconf.enabled:
        yield from protocol.describe_plan(pconf, space_given)
    what = "stage 1 (its first round)" if pconf.enabled else "the sweep"
    yield _cost(trials, what)
    if timing:
        yield timing
        return
    sweeper = base.hydra.sweeper
    seconds = [_seconds(rate, t) for t in trials]
    if space.mode != "grid":  # a search: n_trials like its first
        seconds, what = seconds * int(sweeper.n_trials), f"the search's {sweeper.n_trials} trials"
    elif not pconf.enabled:
        what = "the grid"
    k = estimate.at_a_time(ray_cfg, sweeper.get("max_concurrent"), max(n for n, _ in runs_on), len(seconds))
    yield estimate.line(rate, seconds, k, what)


def _seconds(rate: estimate.Rate, trial: TrialConfig) -> float:
    return rate.seconds(trial, trained_steps(trial.train) * trial.train.tokens_per_step)


def _first(trial: TrialConfig, workers: int, multirun: bool, space, n: int) -> list[str]:
    """The first trial as it will train (on `workers`: part of its identity above 1), and with
    -m what the sweep is."""
    m = trial.model
    out = [OmegaConf.to_yaml(OmegaConf.create(trial.to_dict())).rstrip(),
           f"# identity {trial.identity(workers)}: {trial.preset}, {m.num_params() / 1e6:.2f}M parameters "
           f"({m.num_params(active=True) / 1e6:.2f}M active), {_steps_line(trial.train)}",
           *_passes(trial)]
    if multirun:
        mode = "grid" if space.mode == "grid" else f"Optuna search ({space.swept_keys} sampled)"
        out.append(f"# with -m: {n if space.mode == 'grid' else 'hydra.sweeper.n_trials'} trial(s), {mode}, "
                   "each a Ray Tune trial launched by the smallinit sweeper (hydra/sweeper=smallinit; Hydra's "
                   "launcher setting is not used). Above: the first; all of them:")
    return out


def trained_steps(train) -> int:
    """Optimizer steps a trial trains. With train.budgets: the largest budget's run (its
    cooldown included) plus each other budget's cooldown branch (trainer/schedule.py)."""
    if not train.budgets:
        return train.total_steps
    branches = budget_branches(train.budgets_trained, train.tokens_per_step, train.cooldown_frac)
    main = max(branches, key=lambda b: b.steps)
    return main.steps + sum(b.cooldown for b in branches if b is not main)


def _steps_line(train) -> str:
    steps, tps = trained_steps(train), train.tokens_per_step
    line = f"{steps} steps x {tps} tokens = {steps * tps:,} tokens"
    if train.budgets:
        line += (f" (budgets {', '.join(f'{b:,}' for b in train.budgets_trained)} tokens: the largest run, "
                 f"plus a cooldown of {train.cooldown_frac:g} x each other budget)")
    return line


def _cost(trials: list[TrialConfig], what: str) -> str:
    """Tokens trained and training FLOPs (PaLM's count, as MFU is reported), summed over trials.
    No GPU throughput has been measured in this repository, so no GPU-hours are claimed."""
    tokens = [trained_steps(t.train) * t.train.tokens_per_step for t in trials]
    flops = sum(n * flops_per_token(t) for n, t in zip(tokens, trials))
    return (f"# cost of {what}: {len(trials)} trials, {sum(tokens):,} tokens trained, {flops:.3g} training FLOPs "
            "(6N + 12LdT per token, trainer.config.flops_per_token; evaluation not counted)")


def _memory(trials: list[TrialConfig], runs_on: list[tuple[int, bool]],
            child: subprocess.Popen | None = None) -> list[str]:
    """Per distinct (shape, batch, workers) of the trials: the memory one device needs
    (trainer/machine/memory.py), and where a trial fits no large device, how many FSDP workers would
    fit it on an 80 GB one. runs_on: each trial's (workers, whether it asks for GPUs). child:
    a process from _torch_side to work them out in (default: here)."""
    return _torch_answers(trials, runs_on, child)[0]


def _torch_answers(trials: list[TrialConfig], runs_on: list[tuple[int, bool]], child: subprocess.Popen | None = None,
                   measure: tuple[TrialConfig, int | None] | None = None) -> tuple[list[str], estimate.Rate | str | None]:
    """_memory's lines and, for measure=(trial, threads), its measured rate (estimate.measure;
    a string says why there is none). Both from the child when it answers; else the lines are
    made here, where a failure shows, and the rate is left out (it would import torch here)."""
    from smallinit.trainer.machine.memory import (
        shape_key,  # torch-free: torch is imported where the lines are made
    )

    seen: dict[str, list] = {}
    for trial, (n, gpu) in zip(trials, runs_on):
        t = trial.train
        seen.setdefault(shape_key(trial, t.dtype, t.device, t.parallel, n, gpu), []).append((trial, n, gpu))
    groups = [(*group[0], len(group)) for group in seen.values()]
    if child is not None:
        try:
            out, _ = child.communicate(pickle.dumps((groups, measure)), timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            out, _ = child.communicate()
        if child.returncode == 0:
            kind, value, rate = pickle.loads(out)
            if kind == "error":
                raise value
            return value, rate
    # No child, or it failed: here, where a failure shows its traceback.
    return memory_lines(groups), (None if measure is None else "the process timing it failed")


def memory_lines(groups: list[tuple[TrialConfig, int, bool, int]]) -> list[str]:
    """One line per group (its first trial, workers, whether it asks for GPUs, how many trials)."""
    from smallinit.trainer.machine.memory import estimate, fsdp_workers_to_fit, planned_dtype

    lines = []
    for trial, n, gpu, count in groups:
        dtype = planned_dtype(trial, gpu)
        e = estimate(trial, n, trial.train.parallel, dtype)
        what = f"{count} trial(s) like {trial.identity(n)} ({trial.preset})" if len(groups) > 1 else "each trial"
        line = f"# {what}: {e.line()}"
        if not e.fits(80):
            fit = fsdp_workers_to_fit(trial, 80, dtype)
            line += (f"; with ray.workers_per_trial={fit} train.parallel=fsdp it fits an 80 GB device" if fit else
                     "; no FSDP worker count up to 64 fits an 80 GB device: lower train.batch_size or train.seq_len")
        lines.append(line)
    return lines


def _torch_side() -> subprocess.Popen:
    """A child process that imports what memory_lines needs at once, then reads the groups and
    what to time (pickled) on stdin and writes ("lines", [...], rate) or ("error", ConfigError,
    None) on stdout; on any other failure it exits non-zero and the parent makes the lines
    itself, where the failure shows (so the child's stderr is not shown twice)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.Popen([sys.executable, "-c", "from smallinit.sweeper.results.show import _child; _child()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)


def _child() -> None:
    """The child's side: import torch and trace the smallest model on the meta device (the step
    that imports torch._dynamo) while the parent builds the grid, then make the lines."""
    from smallinit.core.errors import ConfigError
    from smallinit.model.config import ModelConfig
    from smallinit.trainer.machine.memory import saved_activation_bytes

    answer, sys.stdout = sys.stdout.buffer, sys.stderr  # stdout carries the answer alone
    saved_activation_bytes(ModelConfig(d_model=32, n_layers=1, n_heads=1, n_kv_heads=1, d_ff=32, vocab_size=32,
                                       max_seq_len=8), 1, 8, "fp32")
    groups, measure = pickle.loads(sys.stdin.buffer.read())
    try:
        result = ("lines", memory_lines(groups), None)
    except ConfigError as e:  # the parent raises it as its own one-line error
        answer.write(pickle.dumps(("error", e, None)))
        return
    if measure is not None:  # after the lines: the timing has the CPUs to itself
        try:
            result = (*result[:2], estimate.measure(*measure))
        except Exception as e:  # noqa: BLE001 - no estimate is a line, not a failed --show
            from smallinit.core.errors import first_line

            result = (*result[:2], f"timing it failed: {type(e).__name__}: {first_line(e)}")
    answer.write(pickle.dumps(result))


def _container(node) -> dict:
    """A config node as a plain dict ({} for a missing or null node)."""
    return (OmegaConf.to_container(node) or {}) if OmegaConf.is_config(node) else {}


def _passes(trial: TrialConfig) -> list[str]:
    """The budget against the corpus (prepared on first use, then a cache hit) and the verdict
    the launch would give: refused above train.max_epochs, with the line it would print."""
    if not isinstance(trial.data, CorpusData):
        return []
    from smallinit.core.errors import ConfigError
    from smallinit.data.pipeline import prepare

    prepared = prepare(trial.data, log=lambda *_: None)
    line = (f"# {passes(trial, prepared):,.2f} passes over the {prepared.n_train_tokens:,} training tokens of "
            f"{describe(trial.data)} (train.max_epochs={trial.train.max_epochs})")
    try:
        check_trial(trial, prepared)
    except ConfigError as e:
        return [line, f"# a launch would be refused: error: {e}"]
    return [line]
