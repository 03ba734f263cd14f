"""Read a trial's own files for the report: metrics.jsonl (the curves), per_token.npz (token-level
losses) and the probes' snapshots. A damaged file is a ReportError naming it, never skipped (a
figure would silently lose a trial) nor a traceback."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from smallinit.core.errors import first_line
from smallinit.core.metrics_log import DamagedLine, metrics_rows

from .sweep_records import ReportError


def read_metrics(path: str | Path) -> pd.DataFrame:
    """metrics.jsonl -> one row per logged step (later lines win for a repeated step: resume).

    Read by core/metrics_log.py, as every reader of the file: a last line cut short (the trial
    was killed mid-write) is left out; any other line that is not a JSON object with an integer
    step is a ReportError naming the file and the line, not a number quietly dropped."""
    if not isinstance(path, str | Path):
        return pd.DataFrame()
    try:
        rows = metrics_rows(path)
    except OSError as e:
        raise ReportError(f"{path}: cannot be read ({e.strerror or type(e).__name__})") from None
    except DamagedLine as e:
        raise ReportError(f"{path}: {e}: the file is damaged; restore it, or move it aside to "
                          "report without this trial's curves") from None
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    return df.groupby("step", as_index=False).last().sort_values("step").reset_index(drop=True)


def read_per_token(path) -> tuple[np.ndarray, np.ndarray] | None:
    if not isinstance(path, str | Path) or not Path(path).exists():
        return None
    with _npz(path) as z:
        try:
            return z["targets"], z["loss"].astype(np.float64)
        except Exception as e:  # noqa: BLE001 - a missing key or a damaged member
            raise _damaged(path, e) from None


def probe_snapshots(probes_dir) -> list[tuple[int, Path]]:
    """[(step, path)] of the row-cosine snapshots, in step order."""
    if not isinstance(probes_dir, str | Path) or not Path(probes_dir).is_dir():
        return []
    out = []
    for p in Path(probes_dir).glob("step_*.npz"):
        try:
            out.append((int(p.stem.removeprefix("step_")), p))
        except ValueError:
            continue
    return sorted(out)


def read_snapshot(path: Path) -> dict[str, np.ndarray]:
    with _npz(path) as z:
        try:
            return {k: z[k].astype(np.float32) for k in z.files}
        except Exception as e:  # noqa: BLE001 - a damaged member
            raise _damaged(path, e) from None


def _npz(path):
    """np.load of a trial's .npz, or one line naming it: a damaged file must not turn into a
    traceback, nor be skipped (the figures would silently lose a trial)."""
    if not zipfile.is_zipfile(path):
        raise _damaged(path, ValueError("not an .npz (zip) file"))
    try:
        return np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - numpy raises ValueError, OSError, zipfile.BadZipFile...
        raise _damaged(path, e) from None


def _damaged(path, e: Exception) -> ReportError:
    return ReportError(f"{path} is damaged ({first_line(e)}): restore it, or move its trial folder aside and rerun "
                       "the sweep's command to train that trial again")
