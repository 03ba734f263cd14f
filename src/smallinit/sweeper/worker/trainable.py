"""What runs inside a Ray worker: one trial, its metrics forwarded to Ray Tune and W&B.

The worker gets a `TrialSpec` that the driver composed and validated; it never touches
Hydra. A trial that raises or diverges is caught here, written to `failure.json` with its
kind (failures.py: the environment's fault, retried by the next run, or the trial's own) and
reported as failed (Tune's retry is for a crashed worker process, and resumes from the
trial's own checkpoint).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

from smallinit.core.trial_dir import DamagedFile, TrialDir
from smallinit.core.trial_lock import TrialBusy
from smallinit.sweeper.config.spec import TrialSpec

from .failures import TRANSIENT, classify

METRIC = "val_loss"  # what Tune, ASHA and the study optimise (val/loss, renamed for Tune)


class TuneReporter:
    """Forwards each evaluation to Ray Tune (which drives ASHA and the searcher). Under Ray
    Train every rank reports each evaluation through ray.train.report (a collective there);
    TuneReportCallback hands rank 0's rows to Tune."""

    def __init__(self, total_steps: int, train: bool = False):
        self.total_steps, self.train = total_steps, train

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if "val/loss" not in metrics:
            return
        out = {k.replace("/", "_"): v for k, v in metrics.items() if isinstance(v, int | float) and _summary_key(k)}
        out.update({METRIC: metrics["val/loss"], "step": step, "done_training": False})
        if self.train:
            import ray.train

            ray.train.report(out)
        else:
            from ray import tune

            tune.report(out)

    def close(self) -> None:
        pass


def _summary_key(key: str) -> bool:
    """Keep Tune's result rows small: losses, throughput and probe means, not every matrix."""
    return not key.startswith(("stable_rank/", "row_cosine/", "saturation/", "residual_ratio/", "attn_sink/")) or key.endswith("/mean")


def wandb_mode(requested: str) -> str:
    """'auto' is online when the user has configured a key, else offline."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


def wandb_run_id(sweep_name: str, identity: str, out_dir: str) -> str:
    """The trial's W&B run id: stable across resumes of this trial folder on this machine, and
    distinct between machines and folders, so two people's `wandb sync` of the same grid never
    merge into one run (grouping by sweep name is unchanged). W&B allows letters, digits, - and _."""
    place = hashlib.sha1(f"{socket.gethostname()}:{Path(out_dir).resolve()}".encode()).hexdigest()[:8]
    name = re.sub(r"[^A-Za-z0-9_-]", "-", sweep_name)[:32]
    return f"{name}-{identity}-{place}"


class WandbReporter:
    """One W&B run per trial: grouped by sweep, swept keys as top-level config and tags,
    val/loss summarised by its minimum. The run id is the trial identity, so a resumed
    trial continues its run instead of starting a second one."""

    def __init__(self, spec: TrialSpec):
        import wandb

        settings = spec.wandb
        self.run = wandb.init(
            project=settings["project"],  # composed under the root schema: WandbConf holds the default
            entity=settings.get("entity"),
            group=spec.sweep_name,
            name=spec.label(),
            id=wandb_run_id(spec.sweep_name, spec.identity, spec.out_dir),
            resume="allow",
            dir=spec.out_dir,
            mode=wandb_mode(settings["mode"]),  # filled in as project is
            config={**spec.params, "identity": spec.identity, "trial": spec.trial.to_dict()},
            tags=[f"{k}={v}" for k, v in spec.params.items()][:64],
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )
        self.run.define_metric("val/loss", summary="min")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: v for k, v in metrics.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}
        self.run.log(clean, step=step)

    def close(self) -> None:
        # When Tune stops a trial (ASHA) it raises SystemExit inside the trial, and W&B's
        # exit hook has already torn its service down: a failed finish must not turn a
        # pruned or finished trial into a failed one. The offline run file is complete.
        try:
            self.run.finish()
        except Exception as e:  # noqa: BLE001
            import logging

            logging.getLogger(__name__).warning("wandb finish failed: %s", e)


def run_spec(config: dict[str, Any]) -> None:
    """The Tune function trainable: the trial through the trainer's one entry (trainer/entry.py,
    which a single run takes too), its training attempt run and recorded here."""
    import torch
    from ray import tune

    from smallinit.trainer.entry import train_trial
    from smallinit.trainer.folder_checks import ForeignFolder

    spec: TrialSpec = config["spec"]
    out = TrialDir(spec.out_dir)
    torch.set_num_threads(max(1, spec.threads))
    try:  # a result.json the driver could not report was set aside there already (and said so); one put there since is too
        done = train_trial(spec.trial, out.path, spec.identity, fit=lambda: _attempt(spec, out), set_aside_damaged=True,
                           world=spec.workers, log=lambda *parts: _append_line(out.log, " ".join(map(str, parts))))
    except TrialBusy as e:
        tune.report({"failed": 1, "fail_reason": str(e), "fail_kind": TRANSIENT, "done_training": True})
        return
    except (ForeignFolder, DamagedFile) as e:  # a folder that is not this trial's: reported, nothing written there
        kind, reason = classify(e)
        tune.report({"failed": 1, "fail_reason": reason[:1000], "fail_kind": kind, "done_training": True})
        return
    if done is None:  # failed, and reported
        return
    final = {METRIC: done.get("final_val_loss"), "best_val_loss": done.get("best_val_loss"), "step": done["steps"],
             "tokens": done["tokens"], "done_training": True, "failed": 0}
    final.update({k.replace("/", "_"): v for k, v in done.get("final_metrics", {}).items() if _summary_key(k)})
    tune.report(final)


def _attempt(spec: TrialSpec, out: TrialDir) -> dict[str, Any] | None:
    """One attempt at training the trial, its output in the trial's log: the result, or None
    when it failed (recorded in failure.json with its kind, and reported to Tune)."""
    from ray import tune

    from smallinit.trainer.loop import run_trial
    from smallinit.trainer.reporting import MultiReporter

    _record_placement(out)
    reporters = [TuneReporter(spec.trial.train.total_steps)]
    with output_to(out.log):
        print(f"trial {spec.identity} ({spec.label()}), pid {os.getpid()} on {socket.gethostname()}", flush=True)
        previous = out.read_failure(damaged_ok=True)
        if previous is not None:  # its reason stays in this log; the folder no longer says FAIL
            print(f"running again after: {previous.get('reason')}", flush=True)
            out.clear_failure()
        try:
            if spec.workers > 1:
                return _fit_workers(spec, out)
            if spec.wandb["mode"] != "disabled":
                reporters.append(WandbReporter(spec))
            return _as_dict(run_trial(spec.trial, out.path, reporter=MultiReporter(*reporters), identity=spec.identity,
                                      log=lambda *a: print(*a, flush=True), prepared=_prepared(spec)))
        except Exception as e:  # recorded, not retried by Tune: the next run decides (failures.py)
            kind, reason = classify(e)
            trace = traceback.format_exc()
            print(trace, flush=True)
            with contextlib.suppress(OSError):  # a full disk may refuse even this: the study has it
                out.write_failure(reason, trace, kind)
            tune.report({"failed": 1, "fail_reason": reason[:1000], "fail_kind": kind, "done_training": True})
            return None


def _append_line(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def _prepared(spec: TrialSpec):
    """The driver's prepared corpus if this machine has it whole, else None (run_trial prepares)."""
    from smallinit.data.pipeline import still_usable

    if spec.prepared is None:
        return None
    why = still_usable(spec.prepared)
    print(f"data: {spec.prepared.dir}, prepared by the driver" if why is None
          else f"data: the driver's corpus cannot be used here ({why}): preparing it", flush=True)
    return None if why else spec.prepared


def _fit_workers(spec: TrialSpec, out: TrialDir) -> dict[str, Any]:
    """Train the trial as a Ray Train run of spec.workers processes (Ray Train V2's way inside a
    Tune trial: this function trainable builds and fits a TorchTrainer); rank 0 writes the folder."""
    from ray.train import RunConfig, ScalingConfig, WorkerGroupError
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    gpu = spec.gpus > 0
    per_worker = {"CPU": float(spec.threads), **({"GPU": spec.gpus} if gpu else {})}
    trainer = TorchTrainer(
        _worker, train_loop_config={"spec": spec},
        scaling_config=ScalingConfig(num_workers=spec.workers, use_gpu=gpu, resources_per_worker=per_worker),
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        # Ray Train's own records beside Tune's (sweep_dir/ray), out of the trial folder.
        run_config=RunConfig(name=f"train-{spec.identity}", storage_path=str(Path(spec.out_dir).parents[1] / "ray"),
                             callbacks=[TuneReportCallback()]),
    )
    try:
        trainer.fit()
    except WorkerGroupError as e:  # one failed rank's own error, for failures.classify
        raise _first_cause(e.worker_failures) from e
    done = out.read_result()
    if done is None:
        raise RuntimeError(f"the {spec.workers} workers of trial {spec.identity} ended without writing {out.result_json}")
    return done


def _first_cause(worker_failures: dict[int, Exception]) -> BaseException:
    """The error that says why a Ray Train run failed. A rank that died (killed, out of memory:
    Ray's health check of it failed) takes its peers down with it, each with a "connection reset
    by peer" that would read as the trial's own fault: the environment's error comes first (the
    next run resumes the trial), else the lowest rank's."""
    errors = [getattr(f, "cause", None) or getattr(f, "health_check_failure", None) or f
              for _, f in sorted(worker_failures.items())]
    return next((e for e in errors if classify(e)[0] == TRANSIENT), errors[0])


def _worker(config: dict[str, Any]) -> None:
    """One rank of a Ray Train trial: its output lands in trial.log, each line prefixed by its rank."""
    import ray.train
    import ray.train.torch
    import torch

    from smallinit.trainer.distributed import Parallel
    from smallinit.trainer.loop import run_trial
    from smallinit.trainer.reporting import MultiReporter

    spec: TrialSpec = config["spec"]
    rank, out = ray.train.get_context().get_world_rank(), TrialDir(spec.out_dir)
    torch.set_num_threads(max(1, spec.threads))
    device = ray.train.torch.get_device() if spec.gpus > 0 else torch.device("cpu")
    def log(*parts) -> None:  # not print: Ray Train patches it to log each line a second time
        sys.stdout.write(" ".join(map(str, parts)) + "\n")
        sys.stdout.flush()

    with output_to(out.log, prefix=f"[rank {rank}] "):
        log(f"rank {rank}/{spec.workers} of trial {spec.identity}, pid {os.getpid()} on {socket.gethostname()}, "
            f"{spec.trial.train.parallel} on {device}")
        reporters = [TuneReporter(spec.trial.train.total_steps, train=True)]
        if rank == 0 and spec.wandb["mode"] != "disabled":
            reporters.append(WandbReporter(spec))
        run_trial(spec.trial, out.path, reporter=MultiReporter(*reporters), log=log, identity=spec.identity,
                  dist=Parallel(spec.trial.train.parallel, device))


@contextlib.contextmanager
def output_to(path: Path, prefix: str = ""):
    """Send this process's stdout and stderr (file descriptors 1 and 2, so warnings from C
    extensions too) to path while the trial runs: a user finds a trial's output in its folder,
    not in Ray's session logs. Appends, so a retried trial keeps its first attempt's output.
    With a prefix (a Ray Train worker's rank), each line goes through a pipe that adds it."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        pipe = _prefixed(f, prefix) if prefix else None
        target = pipe[0] if pipe else f.fileno()
        os.dup2(target, 1)
        os.dup2(target, 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            if pipe:
                os.close(pipe[0])  # the last writer: the reader sees EOF, writes what is left
                pipe[1].join(timeout=10)


def _prefixed(f, prefix: str):
    """(a pipe's write end, the thread that copies its lines to f with prefix before each).
    Each line is one write to a file opened for appending, so ranks' lines do not interleave."""
    import threading

    read_fd, write_fd = os.pipe()
    head = prefix.encode()

    def copy() -> None:
        with os.fdopen(read_fd, "rb") as r:
            for line in r:
                f.write(head + line)
                f.flush()

    thread = threading.Thread(target=copy, daemon=True, name="rank-output")
    thread.start()
    return write_fd, thread


def _record_placement(out: TrialDir) -> None:
    """Which node and CPU ran the trial (each attempt appends: a resumed trial may span machines,
    whose kernels round differently), for the results table."""
    import ray

    from smallinit.core.provenance import CPU_FLAGS, cpu_identity

    model, flags = cpu_identity()
    cpu = " ".join([model, *(f for f in CPU_FLAGS if f in flags)])
    out.record_attempt(ray.get_runtime_context().get_node_id(), socket.gethostname(), os.getpid(), cpu)


def _as_dict(result) -> dict[str, Any]:
    from dataclasses import asdict

    return json.loads(json.dumps(asdict(result), default=str))
