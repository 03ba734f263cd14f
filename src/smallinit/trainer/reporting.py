"""One small interface for metrics: the training loop calls `log(step, metrics)` and nothing
else, so a plain run can print them, the sweeper can forward them to Ray Tune and W&B, and
every trial keeps its own metrics.jsonl whatever else listens."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Protocol

from smallinit.core.metrics_log import DamagedLine, metrics_rows
from smallinit.core.trial_dir import DamagedFile


class Reporter(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class JsonlReporter:
    """Appends one JSON line per call to a file: the trial's own durable record.

    Lines are flushed as written; on resume the file is first cut back to the checkpoint's
    step so no step appears twice. A last line a kill or a full disk cut short is dropped then
    (core/metrics_log.py); any other bad line is DamagedFile naming the file."""

    def __init__(self, path: Path, resume_step: int | None = None):
        self.path = Path(path)
        if resume_step is not None and self.path.exists():
            try:
                rows = metrics_rows(self.path)
            except DamagedLine as e:
                raise DamagedFile(self.path, e) from None
            self.path.write_text("".join(json.dumps(row) + "\n" for row in rows if row["step"] <= resume_step))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        self._file = self.path.open("a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class ConsoleReporter:
    """A rich progress bar with the latest train and validation loss, for plain runs."""

    def __init__(self, total_steps: int, description: str = "train", start_step: int = 0):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            transient=False,
        )
        self.task = self.progress.add_task(description, total=total_steps, completed=start_step, status="")
        self.progress.start()
        self.latest: dict[str, float] = {}
        self._last_print = 0.0

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.latest.update(metrics)
        parts = []
        for key, label in (("train/loss", "loss"), ("val/loss", "val"), ("anchor/in_dist_acc", "acc"), ("perf/tokens_per_s", "tok/s")):
            if key in self.latest and self.latest[key] is not None:
                parts.append(f"{label} {self.latest[key]:.4g}")
        self.progress.update(self.task, completed=step, status="  ".join(parts))

    def close(self) -> None:
        self.progress.stop()


class MultiReporter:
    def __init__(self, *reporters: Reporter):
        self.reporters = [r for r in reporters if r is not None]

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for r in self.reporters:
            r.log(step, metrics)

    def close(self) -> None:
        for r in self.reporters:
            r.close()


class Timer:
    """Wall time excluding pauses (evaluation, probes, checkpoints) for honest tokens/s."""

    def __init__(self):
        self.elapsed = 0.0
        self._start: float | None = None

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.elapsed += time.perf_counter() - self._start
