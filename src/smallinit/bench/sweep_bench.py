"""sweep_overhead: `python sweep.py -m init.gamma=...` against the ideal for the same trials.

The sweep is the command a user runs (local Ray, Optuna study in SQLite, W&B offline, the
results table), from an empty folder, on a prepared corpus cache, at
`ray.num_cpus=C hydra.sweeper.max_concurrent=C`; its wall time is process start to exit.

The ideal: each trial's bare time summed and divided by C. The bare per-trial time is
`run_trial` of the same TrialConfig (so trainer costs, measured by trainer_vs_bare, are not
counted twice) in a plain pool of C warm worker processes, 1 torch thread each (what
ray.cpus_per_trial=1 gives a trial): the trials meet the same core contention as in the sweep,
but no Ray, Hydra, Optuna, W&B or process start-up. The pool's own wall time is reported too.
Sweep and pool alternate (ABAB) at each size; the extra W&B-disabled sweep is compared with the
latest pool run of the same trials.

Then `make sweep` itself (the Makefile's grid on the default trials) is timed once, between two
pool runs of its trials: the ratio a user of the default command pays.

Where a sweep's time goes is read back from its trial folders: placement.json is written when
the Ray worker starts the trial, trial.json when run_trial starts (after W&B's init), result.json
when run_trial ends. Driver memory: its own peak (VmHWM; wait4's figure also counts the Ray
processes it reaps, one of which can be larger) and the RSS summed over its process tree (Ray's GCS, raylet and workers),
sampled from /proc once a second, with the CPU seconds of each process role and of the trial
workers' threads (cpu_account.py).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from smallinit.core.trial_dir import TrialDir

from .base.common import REPO, cache_dir, compose_trial, median, prepared_data, progress, spread
from .base.cpu_account import TreeSampler

TARGET = {"op": "<=", "value": 1.10}


def gammas(n: int) -> list[float]:
    return [round(0.5 + 0.05 * i, 4) for i in range(n)]


# ---- the baseline: a plain process pool running run_trial ----

# Ray's raylet starts its workers at this niceness (RayConfig worker_niceness; ps shows 15 on
# Ray 2.x). The pool's workers take the same, so on a machine busy with other work the pool and
# the sweep compete for the cores alike; at nice 0 the pool would win the cores the sweep's
# workers lose, and the ratio would count that as the sweep's overhead.
RAY_WORKER_NICENESS = 15


def _pool_init() -> None:
    os.nice(max(0, RAY_WORKER_NICENESS - os.nice(0)))


def _pool_warm(trial, threads: int) -> None:
    import torch

    from smallinit.trainer.loop import run_trial

    torch.set_num_threads(threads)
    out = tempfile.mkdtemp(prefix="smallinit-bench-warm-")
    try:
        run_trial(trial, Path(out), log=lambda *_: None)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    time.sleep(0.5)  # hold this worker so the next warm-up job starts the other one


def _pool_trial(trial, threads: int) -> float:
    import torch

    from smallinit.trainer.loop import run_trial

    torch.set_num_threads(threads)
    out = tempfile.mkdtemp(prefix="smallinit-bench-pool-")
    try:
        t0 = time.perf_counter()
        run_trial(trial, Path(out), log=lambda *_: None)
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)


def pool_run(pool, trials, concurrency: int) -> dict:
    t0 = time.perf_counter()
    times = list(pool.map(_pool_trial, trials, [1] * len(trials)))
    wall = time.perf_counter() - t0
    return {"ideal_s": sum(times) / concurrency, "pool_wall_s": wall, "trial_s": median(times)}


# ---- the measured side: the real sweep command ----

def sweep_run(n: int, settings, wandb_mode: str, cache: Path, repo: Path = REPO, grid: tuple[str, ...] | None = None) -> dict:
    """One `sweep.py -m` of n trials: the short-trial gamma grid, or `grid` (n points) on the
    default trials; `repo` lets a patched copy of the code be timed the same way."""
    cwd = Path(tempfile.mkdtemp(prefix="smallinit-bench-sweep-"))
    name = f"bench{n}"
    trials = grid if grid is not None else ("init.gamma=" + ",".join(str(g) for g in gammas(n)), *settings.sweep_overrides)
    args = ["-m", *trials,
            f"ray.num_cpus={settings.concurrency}", f"hydra.sweeper.max_concurrent={settings.concurrency}",
            f"wandb.mode={wandb_mode}", f"name={name}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(repo, "src"), str(repo)]), "SMALLINIT_CACHE": str(cache), "WANDB_API_KEY": "",
           "WANDB_SILENT": "true"}
    log_path = cwd / "sweep.log"
    try:
        with log_path.open("w") as log:
            t_start = time.time()
            proc = subprocess.Popen([sys.executable, str(repo / "sweep.py"), *args], cwd=cwd, env=env,
                                    stdout=log, stderr=subprocess.STDOUT)
            sampler = TreeSampler(proc.pid)
            sampler.start()
            # wait4's peak RSS is the driver's or that of a Ray process it reaped, whichever is
            # larger (a Ray daemon, on some machines): the driver's own is its VmHWM.
            _, status, usage = os.wait4(proc.pid, 0)
            t_end = time.time()
            proc.returncode = rc = os.waitstatus_to_exitcode(status)
            sampler.stop()
        trials = [d for d in TrialDir.all_in_sweep(cwd / "sweeps" / name) if d.finished]
        if rc != 0 or len(trials) != n:
            tail = log_path.read_text()[-2000:]
            raise RuntimeError(f"sweep of {n} trials exited {rc} with {len(trials)} results:\n{tail}")
        out = {"wall_s": t_end - t_start, "driver_peak_rss_mb": sampler.root_hwm_kb / 1024,
               "driver_or_reaped_peak_rss_mb": usage.ru_maxrss / 1024,
               "tree_peak_rss_mb": sampler.tree_rss_kb / 1024, "tree_max_processes": sampler.tree_max,
               # Where the CPU went (cpu_account.py): the trials' training threads against
               # what Ray's daemons, the driver and W&B take from the same cores.
               "cpu_s_by_role": sampler.cpu.by_role(), "cpu_s_worker_threads": sampler.cpu.worker_threads()}
        out.update(_timeline(trials, t_start, t_end, settings.concurrency))
        return out
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def _timeline(dirs: list[TrialDir], t_start: float, t_end: float, concurrency: int) -> dict:
    def mtime(path: Path) -> float:
        return path.stat().st_mtime

    planned = min(mtime(d.sweep_json) for d in dirs)
    start = sorted(mtime(d.placement_json) for d in dirs)
    run_start = [mtime(d.trial_json) for d in dirs]
    ends = sorted(mtime(d.result_json) for d in dirs)
    init = [mtime(d.trial_json) - mtime(d.placement_json) for d in dirs]
    in_trial = [mtime(d.result_json) - mtime(d.trial_json) for d in dirs]
    # Trial k (in start order) takes the slot freed by the (k - C)-th trial to end.
    dispatch = [start[k] - ends[k - concurrency] for k in range(concurrency, len(start))]
    pids = {a["pid"] for d in dirs for a in d.read_attempts()}
    return {
        "worker_processes": len(pids),  # one per trial unless Tune reuses its actors
        "to_planned_s": planned - t_start,  # interpreter, Hydra, composing trials, Ray, study, data check
        "planned_to_first_worker_s": start[0] - planned,  # Tune starts, the first worker process comes up
        "to_first_trial_s": min(run_start) - t_start,  # ... and W&B's init: the first run_trial starts
        "worker_dispatch_s": median(dispatch) if dispatch else None,  # a slot frees -> next trial's worker runs
        "trial_setup_s": median(init),  # worker start -> run_trial starts (W&B init)
        "run_trial_s": median(in_trial),
        "tail_s": t_end - max(ends),  # last trial ends -> command exits (results table, shutdown)
    }


# ---- the benchmark ----

def run(settings) -> dict:
    name = "sweep_overhead"
    cache = cache_dir()
    base = compose_trial(*settings.sweep_overrides)
    prepared_data(base)
    trials = {n: [compose_trial(*settings.sweep_overrides, f"init.gamma={g}") for g in gammas(n)]
              for n in settings.sweep_sizes}
    plan = [(settings.sweep_headline, "offline")]
    plan += [(n, "offline") for n in settings.sweep_sizes if n != settings.sweep_headline]
    plan += [(settings.sweep_headline, "offline")] * (settings.sweep_repeats - 1)
    if settings.sweep_wandb_disabled:
        plan.append((settings.sweep_headline, "disabled"))
    t = base.train
    progress(name, f"{base.preset} trials of {t.total_steps} steps x {t.tokens_per_step} tokens, concurrency "
                   f"{settings.concurrency}, sizes {list(settings.sweep_sizes)}; {len(plan)} sweeps, alternating with pool runs")
    points = []
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=settings.concurrency, mp_context=ctx, initializer=_pool_init) as pool:
        warm = [pool.submit(_pool_warm, trials[settings.sweep_sizes[0]][0], 1) for _ in range(settings.concurrency)]
        for f in warm:
            f.result()
        for i, (n, mode) in enumerate(plan):
            order = ["sweep", "pool"] if i % 2 == 0 else ["pool", "sweep"]
            point = {"trials": n, "wandb": mode}
            if mode == "disabled":  # compared with the latest pool run of the same trials
                order = ["sweep"]
                prev = [p for p in points if p["trials"] == n][-1]
                point.update({k: prev[k] for k in ("ideal_s", "pool_wall_s", "trial_s")})
            for side in order:
                point.update(sweep_run(n, settings, mode, cache) if side == "sweep"
                             else pool_run(pool, trials[n], settings.concurrency))
            point["ratio"] = point["wall_s"] / point["ideal_s"]
            points.append(point)
            progress(name, f"{n:2d} trials (wandb {mode}): sweep {point['wall_s']:6.1f} s, ideal {point['ideal_s']:6.1f} s "
                           f"(pool {point['pool_wall_s']:.1f} s) -> {point['ratio']:.2f}; first trial after "
                           f"{point['to_first_trial_s']:.1f} s, driver peak {point['driver_peak_rss_mb']:.0f} MB")
        out = _assemble(points, settings)
        out["pool_niceness"] = pool.submit(os.nice, 0).result()  # the same as Ray's workers (above)
        if settings.make_sweep_grid:
            out["make_sweep"] = _make_sweep(pool, settings, cache)
    return out


MAKE_SWEEP_TARGET = {"op": "<=", "value": 1.05}


def split(out: dict, names: set[str]) -> dict[str, dict]:
    """The run's two entries: the short-trial series, and `make sweep` on real trials (its own
    key in results.json, with its own target)."""
    got = {"sweep_overhead": out}
    ms = out.get("make_sweep")
    if "sweep_overhead_make_sweep" in names:
        got["sweep_overhead_make_sweep"] = (
            {**ms, "target": MAKE_SWEEP_TARGET, "pass": ms["ratio"] <= MAKE_SWEEP_TARGET["value"], "repeats": 1,
             "metric": "`make sweep` wall time / the mean of a process pool's wall time on the same trials before and after"}
            if ms else {"skipped": "this run's settings have no make_sweep grid", "target": MAKE_SWEEP_TARGET})
    return {n: got[n] for n in names if n in got}


def _make_sweep(pool, settings, cache: Path) -> dict:
    """`make sweep` itself: its grid on the default trials, timed between two pool runs of
    the same trials. These trials run minutes, and the machine's speed drifts by several
    percent over minutes: the ideal is the mean of the pool run before and the one after."""
    import itertools

    axes = [[f"{kv.split('=', 1)[0]}={v}" for v in kv.split("=", 1)[1].split(",")] for kv in settings.make_sweep_grid]
    trials = [compose_trial(*point, *settings.make_sweep_overrides) for point in itertools.product(*axes)]
    n = len(trials)
    progress("sweep_overhead", f"`make sweep`: {n} default trials ({' '.join(settings.make_sweep_grid)}), "
                               "pool, sweep, pool")
    before = pool_run(pool, trials, settings.concurrency)
    point = {"trials": n, "wandb": "offline",
             **sweep_run(n, settings, "offline", cache, grid=(*settings.make_sweep_grid, *settings.make_sweep_overrides))}
    after = pool_run(pool, trials, settings.concurrency)
    point.update({k: (before[k] + after[k]) / 2 for k in ("ideal_s", "pool_wall_s", "trial_s")})
    point["pool_ideals_s"] = [before["ideal_s"], after["ideal_s"]]
    point["ratio"] = point["wall_s"] / point["ideal_s"]
    progress("sweep_overhead", f"`make sweep`: sweep {point['wall_s']:.1f} s, ideal {point['ideal_s']:.1f} s "
                               f"(pool before {before['ideal_s']:.1f} s, after {after['ideal_s']:.1f} s) -> {point['ratio']:.2f}")
    return point


def _assemble(points: list[dict], settings) -> dict:
    offline = [p for p in points if p["wandb"] == "offline"]
    head = [p for p in offline if p["trials"] == settings.sweep_headline]
    series = []
    for n in settings.sweep_sizes:
        ps = [p for p in offline if p["trials"] == n]
        series.append({"trials": n, "ratio": median(p["ratio"] for p in ps), "wall_s": median(p["wall_s"] for p in ps),
                       "ideal_s": median(p["ideal_s"] for p in ps), "pool_wall_s": median(p["pool_wall_s"] for p in ps),
                       "overhead_s": median(p["wall_s"] - p["ideal_s"] for p in ps),
                       "driver_peak_rss_mb": max(p["driver_peak_rss_mb"] for p in ps),
                       "driver_or_reaped_peak_rss_mb": max(p["driver_or_reaped_peak_rss_mb"] for p in ps),
                       "tree_peak_rss_mb": max(p["tree_peak_rss_mb"] for p in ps), "repeats": len(ps)})
    fit = _fit([p["trials"] for p in offline], [p["wall_s"] - p["ideal_s"] for p in offline])
    ratio = median(p["ratio"] for p in head)
    out = {
        "ratio": ratio,
        "target": TARGET,
        "pass": ratio <= TARGET["value"],
        "metric": f"wall time of `sweep.py -m` with {settings.sweep_headline} trials at concurrency "
                  f"{settings.concurrency} (W&B offline) / ideal (sum of bare run_trial times / {settings.concurrency})",
        "baseline": {"ideal_s": median(p["ideal_s"] for p in head), "pool_wall_s": median(p["pool_wall_s"] for p in head),
                     "trial_s": median(p["trial_s"] for p in head)},
        "measured": {"wall_s": median(p["wall_s"] for p in head),
                     **{k: median(p[k] for p in head) for k in ("to_first_trial_s", "worker_dispatch_s",
                                                                 "trial_setup_s", "run_trial_s", "tail_s")}},
        "series": series,
        "fit": fit,
        "driver_peak_rss_mb": max(p["driver_peak_rss_mb"] for p in points),
        "tree_peak_rss_mb": max(p["tree_peak_rss_mb"] for p in points),
        "concurrency": settings.concurrency,
        "trial_overrides": list(settings.sweep_overrides),
        "spread": spread(p["ratio"] for p in head),
        "repeats": len(head),
        "runs": points,
    }
    out["measured"].update(worker_processes=median(p["worker_processes"] for p in head), trials=settings.sweep_headline)
    if fit:
        # The cost that grows with the sweep: each extra trial's overhead against its share of
        # the ideal (a bare trial's time / concurrency). The fixed part is paid once per command.
        per_trial_ideal = out["baseline"]["trial_s"] / settings.concurrency
        out["marginal_ratio"] = (per_trial_ideal + fit["per_trial_s"]) / per_trial_ideal
    disabled = [p for p in points if p["wandb"] == "disabled"]
    if disabled:
        out["wandb_disabled_ratio"] = median(p["ratio"] for p in disabled)
    return out


def _fit(ns: list[int], overheads: list[float]) -> dict | None:
    """Least squares overhead = fixed + per_trial * n: what a sweep costs once, and per trial."""
    if len(set(ns)) < 2:
        return None
    mean_n, mean_o = sum(ns) / len(ns), sum(overheads) / len(overheads)
    slope = sum((n - mean_n) * (o - mean_o) for n, o in zip(ns, overheads)) / sum((n - mean_n) ** 2 for n in ns)
    return {"fixed_s": mean_o - slope * mean_n, "per_trial_s": slope}
