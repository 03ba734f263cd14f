"""Which sweep `make report` reads when it is not told: the main job's (`make sweep`'s) when it has
a results table, else the newest, and the first line says which."""

from __future__ import annotations

import pandas as pd
import pytest

from smallinit.experiments.data.load import ReportError, resolve_dirs
from smallinit.experiments.report.report import main as report_main


def test_newest_sweep_is_the_latest_results_table(tmp_path):
    import os

    for i, name in enumerate(("old", "new")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.parquet").write_bytes(b"x")
        os.utime(tmp_path / name / "results.parquet", (1000 + i, 1000 + i))
    assert resolve_dirs(None, tmp_path) == [tmp_path / "new"]
    assert resolve_dirs("old,new", tmp_path) == [tmp_path / "old", tmp_path / "new"]
    with pytest.raises(ReportError):
        resolve_dirs(None, tmp_path / "none")



def test_without_a_sweep_the_report_is_of_the_main_jobs_and_says_so(tmp_path, capsys):
    import os

    from smallinit.experiments.data.load import MAIN_SWEEP, default_sweep
    from smallinit.sweeper.config.schema import SmallinitConf

    assert MAIN_SWEEP == SmallinitConf().name  # `make sweep` writes sweeps/<the default name>
    empty = pd.DataFrame({"identity": pd.Series(dtype=str), "state": pd.Series(dtype=str)})
    for i, name in enumerate(("smallinit", "newer")):
        (tmp_path / name).mkdir()
        empty.to_parquet(tmp_path / name / "results.parquet")
        os.utime(tmp_path / name / "results.parquet", (1000 + i, 1000 + i))
    assert resolve_dirs(None, tmp_path) == [tmp_path / "smallinit"]  # though another sweep is newer
    assert report_main(["--sweeps-root", str(tmp_path)]) == 2  # (its table has no trials)
    err = capsys.readouterr().err
    assert err.startswith(f"report of {tmp_path / 'smallinit'} (the main job's, `make sweep`; SWEEP=<folder> for another)\n")
    (tmp_path / "smallinit" / "results.parquet").unlink()  # not run yet: the newest, named as such
    folder, which = default_sweep(tmp_path)
    assert folder == tmp_path / "newer" and which.startswith(f"{folder}, the newest sweep (no {tmp_path / 'smallinit'}/")
