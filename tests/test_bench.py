"""`python -m smallinit.bench --tiny` runs and writes well-formed results, each entry with its provenance,
and docs/benchmarks.md is what the committed results give. Not timed: CI machines are too noisy
for assertions on speed; the figures themselves come from `make bench`."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smallinit.bench import BENCHMARKS
from smallinit.bench import doc as bench_doc
from smallinit.bench.base.common import TINY, median, rotate, timed_calls
from smallinit.bench.report import BEFORE_PROVENANCE
from smallinit.bench.sweep_bench import _fit
from smallinit.core.provenance import CPU_FLAGS

from .conftest import REPO


@pytest.fixture(scope="module")
def tiny_results(data_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), "SMALLINIT_CACHE": str(data_cache), "WANDB_API_KEY": ""}
    proc = subprocess.run([sys.executable, "-m", "smallinit.bench", "--tiny", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text()), proc.stdout


def _positive(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_every_benchmark_is_measured_or_skipped_with_a_reason(tiny_results):
    _, results, _ = tiny_results
    assert results["machine"]["cpu_count"] >= 1 and results["machine"]["torch"]
    assert results["settings"]["mode"] == "tiny" and results["timestamp"]
    assert set(results["benchmarks"]) == set(BENCHMARKS)
    for name, entry in results["benchmarks"].items():
        assert "error" not in entry, (name, entry)
        if "skipped" in entry:
            assert name == "gpu_mfu" and entry["skipped"].strip(), entry
            continue
        assert entry["pass"] in (True, False, None) and entry["repeats"] >= 1, name
        if entry.get("target") is not None:
            assert entry["target"]["op"] in (">=", "<=") and _positive(entry["target"]["value"])
            if entry["ratio"] is None:  # gpu_mfu on a GPU whose peak is unknown
                assert entry["pass"] is None
                continue
            assert entry["pass"] == (entry["ratio"] >= entry["target"]["value"] if entry["target"]["op"] == ">="
                                     else entry["ratio"] <= entry["target"]["value"])


@pytest.mark.slow
def test_ratios_are_positive_and_finite(tiny_results):
    _, results, _ = tiny_results
    b = results["benchmarks"]
    for name in ("trainer_vs_bare", "probe_overhead", "sweep_overhead"):
        assert _positive(b[name]["ratio"]), name
        assert all(_positive(r) for r in b[name].get("paired_ratios", [b[name]["ratio"]]))
    t = b["trainer_vs_bare"]
    assert _positive(t["ratio_steps"]) and _positive(t["ratio_end_to_end"]) and 0 <= t["eval_share"] < 1
    assert _positive(t["baseline"]["tokens_per_s"]) and _positive(t["measured"]["tokens_per_s"])
    assert _positive(t["ratio_direct"]) and t["ratio_direct"] <= 1
    p = b["probe_overhead"]
    assert _positive(p["ratio_paired_runs"]) and p["measured"]["probe_s"] > 0 and p["ratio"] >= 1
    s = b["sweep_overhead"]
    assert [p["trials"] for p in s["series"]] == list(TINY.sweep_sizes)
    assert all(_positive(p["ratio"]) and p["wall_s"] > p["ideal_s"] > 0 for p in s["series"])
    assert _positive(s["driver_peak_rss_mb"]) and _positive(s["tree_peak_rss_mb"])
    # wait4's figure is the largest of the driver and the processes it reaped: never below the driver's own.
    assert all(p["driver_or_reaped_peak_rss_mb"] >= p["driver_peak_rss_mb"] for p in s["series"])
    assert s["fit"] is not None and all(math.isfinite(v) for v in s["fit"].values())
    m = s["make_sweep"]  # `make sweep`'s grid (on tiny trials here) against the same pool
    assert m["trials"] == 2 and m["wall_s"] > m["ideal_s"] > 0 and _positive(m["ratio"])
    assert len(m["pool_ideals_s"]) == 2 and m["ideal_s"] == pytest.approx(sum(m["pool_ideals_s"]) / 2)  # pool, sweep, pool
    ms = b["sweep_overhead_make_sweep"]  # the same `make sweep` point under its own key and target
    assert ms["ratio"] == m["ratio"] and ms["target"]["value"] == 1.05
    bf = b["cpu_bf16_speedup"]  # both dtypes measured in this run, whatever the CPU
    assert _positive(bf["ratio"]) and bf["auto_choice"] in ("fp32", "bf16") and bf["auto_reason"]
    assert bf["ratio"] == pytest.approx(bf["measured"]["tokens_per_s"] / bf["baseline"]["tokens_per_s"])
    mfu = b["cpu_mfu"]
    assert 0 < mfu["ratio"] < 2 and _positive(mfu["baseline"]["matmul_gflops"])
    a = b["cpu_allocator"]  # both allocator settings, each in a fresh process, in this run
    assert _positive(a["ratio"]) and a["ratio"] == pytest.approx(median(a["paired_ratios"]))
    assert a["baseline"]["allocator"] == "default" and a["measured"]["allocator"] == "retain"
    assert all(_positive(a[side]["peak_rss_mb"]) and a[side]["faults_per_step"] >= 0 for side in ("baseline", "measured"))
    c = b["cpu_compile"]  # compiled and eager trials, each in a fresh process, in this run
    assert _positive(c["ratio"]) and c["ratio"] == pytest.approx(c["baseline"]["wall_s"] / c["measured"]["wall_s_warm"])
    assert _positive(c["step_ratio"])
    assert c["decision"].startswith("train.compile stays false" if c["ratio"] < 1.10 else "compile is >= 1.10x")
    d = b["data_prep"]
    assert _positive(d["cold_s"]) and _positive(d["warm_s"]) and d["corpus"]["train_tokens"] > 0


@pytest.mark.slow
def test_cpu_mfu_by_width_is_the_scaling_law_shape_with_a_paired_ratio_per_width(tiny_results):
    out, results, _ = tiny_results
    e = results["benchmarks"]["cpu_mfu_by_width"]
    assert list(e["widths"]) == [str(d) for d in TINY.cpu_widths]
    assert e["dtype"] in ("fp32", "bf16") and e["dtype_reason"] and (e["note"] is None) == (e["dtype"] == "bf16")
    for d, w in e["widths"].items():
        assert w["n_heads"] == int(d) // 32  # heads of 32, as conf/experiment/scaling_law.yaml sets
        assert len(w["runs"]) == e["repeats"] and all(_positive(r["matmul_gflops"]) for r in w["runs"])
        for r in w["runs"]:  # each repeat's MFU is its own throughput over the peak timed beside it
            assert r["mfu"] == pytest.approx(r["tokens_per_s"] * w["flops_per_token"] / (r["matmul_gflops"] * 1e9))
        assert 0 < w["mfu"] < 2 and w["mfu"] == pytest.approx(median(r["mfu"] for r in w["runs"]))
        assert w["pass"] == (w["mfu"] >= e["target"]["value"])
    # A wider model does more FLOPs per token; the figure is the worst width's.
    fpt = [w["flops_per_token"] for w in e["widths"].values()]
    assert fpt == sorted(fpt) and len(set(fpt)) == len(fpt)
    assert e["ratio"] == min(w["mfu"] for w in e["widths"].values())
    table = (out / "results.md").read_text()
    assert all(f"|   d={d} |" in table for d in TINY.cpu_widths)


@pytest.mark.slow
def test_markdown_table_has_a_row_per_benchmark(tiny_results):
    out, results, stdout = tiny_results
    table = (out / "results.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    for name in BENCHMARKS:
        row = next((r for r in rows if r.startswith(f"| {name}")), None)
        assert row is not None, name
        result = [c.strip() for c in row.strip().strip("|").split("|")][3]  # benchmark, figure, target, result
        passed = results["benchmarks"][name].get("pass")  # a target met or missed; absent: recorded only
        assert result == {True: "PASS", False: "MISS"}.get(passed, result) and (passed is not None or result not in ("PASS", "MISS")), (name, result)
    assert "| `make sweep` grid (2 trials)" in table.replace("|   ", "| ")
    assert table.strip() in stdout  # the final table is printed too


@pytest.mark.slow
def test_every_entry_records_its_commit_date_machine_and_cpu_flags(tiny_results):
    _, results, _ = tiny_results
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = {f for line in cpuinfo.splitlines() if line.split(":")[0].strip() in ("flags", "Features")
             for f in line.split(":", 1)[1].split()}
    for name, entry in results["benchmarks"].items():
        p = entry["provenance"]
        # The commit the run measured: HEAD then, so HEAD or its ancestor now (a shared tree moves on).
        assert re.fullmatch(r"[0-9a-f]{40}", p["commit"]) and isinstance(p["uncommitted"], list), name
        assert git("merge-base", "--is-ancestor", p["commit"], "HEAD").returncode == 0, name
        assert time.strptime(p["date"], "%Y-%m-%dT%H:%M:%S%z") and p["date"] >= results["timestamp"], name
        assert p["machine"]["cpu_count"] == os.cpu_count() and p["machine"]["torch"], name
        assert p["machine"]["cpu_flags"] == [f for f in CPU_FLAGS if f in flags] and "cpu_flags" not in p, name


@pytest.mark.slow
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="gpu_mfu would run for real here")
def test_only_writes_a_whole_file_of_its_own_run(tiny_results, tmp_path):
    from smallinit.bench.__main__ import main

    out, before, _ = tiny_results
    assert main(["--tiny", "--only", "gpu_mfu", "--out", str(tmp_path)]) == 0
    after = json.loads((tmp_path / "results.json").read_text())
    assert after["settings"]["selected"] == ["gpu_mfu"] and set(after["benchmarks"]) == set(BENCHMARKS)
    assert after["benchmarks"]["gpu_mfu"]["skipped"].startswith("no CUDA device")
    for name, entry in after["benchmarks"].items():  # nothing is carried over from an earlier run
        assert entry["provenance"]["date"] >= after["timestamp"], name
        if name != "gpu_mfu":
            assert entry["skipped"] == "not selected (--only)", name
    assert json.loads((out / "results.json").read_text()) == before  # the other folder is untouched


@pytest.mark.slow
def test_dp_scaling_times_the_same_trial_on_two_workers_and_on_one(tiny_results):
    out, results, _ = tiny_results
    e = results["benchmarks"]["dp_scaling"]
    assert e["target"] is None and e["pass"] is None and e["repeats"] == TINY.repeats
    b, m = e["baseline"], e["measured"]
    assert (b["workers"], b["threads"], m["workers"], m["threads"]) == (1, 2, 2, 1)
    assert _positive(b["tokens_per_s"]) and _positive(m["tokens_per_s"])
    runs = e["runs"]
    assert len(runs["baseline"]) == len(runs["measured"]) == len(e["paired_ratios"]) == e["repeats"]
    for x, y, r in zip(runs["baseline"], runs["measured"], e["paired_ratios"]):
        # the same trial both ways: its steps, tokens and (up to summation order) its loss
        assert x["steps"] == y["steps"] == e["steps"] and x["tokens"] == y["tokens"]
        assert y["final_val_loss"] == pytest.approx(x["final_val_loss"], rel=1e-2)
        assert r == pytest.approx(y["tokens_per_s"] / x["tokens_per_s"])
    assert e["ratio"] == pytest.approx(median(e["paired_ratios"]))
    assert e["ratio"] == pytest.approx(m["tokens_per_s"] / b["tokens_per_s"])  # one repeat: the medians' ratio too
    assert "not a speedup" in e["note"]
    p = e["provenance"]
    assert re.fullmatch(r"[0-9a-f]{40}", p["commit"]) and p["machine"]["cpu_count"] == os.cpu_count()
    row = next(line for line in (out / "results.md").read_text().splitlines() if line.startswith("| dp_scaling |"))
    assert "| recorded |" in row and "(ddp, gloo)" in row


def test_a_benchmark_missing_from_the_record_renders_as_not_measured():
    from smallinit.bench.report import NOT_MEASURED

    results = json.loads(bench_doc.RESULTS.read_text())
    results["benchmarks"].pop("dp_scaling", None)
    text = bench_doc.render(bench_doc.DOC.read_text(), results)
    assert "| dp_scaling | - | - | not measured yet | - | - | - | no entry in this results file |" in text
    assert f"| dp_scaling | - | {NOT_MEASURED} | - | - |" in text


@pytest.mark.parametrize("args", [["--tiny"], ["--only", "gpu_mfu"], ["--tiny", "--only", "data_prep", "--out", str(REPO / "bench")]])
def test_a_part_or_a_tiny_run_is_refused_in_the_record_folder(args, capsys):
    from smallinit.bench.__main__ import main

    record = REPO / "bench" / "results.json"
    before = record.read_bytes()
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "is invalid without --out DIR" in last and "one whole `make bench` run" in last
    assert record.read_bytes() == before


def test_benchmarks_doc_is_what_the_committed_results_give():
    assert bench_doc.main(["--check"]) == 0


def test_benchmarks_doc_prose_quotes_no_measured_figure():
    """Figures live in the generated tables: the hand-written prose may name a run's settings
    (the trial counts, the matmul's side) but no measurement, so none can go stale."""
    from records.quoted import stray

    doc = bench_doc.DOC.read_text()
    results = json.loads(bench_doc.RESULTS.read_text())
    generated = "".join(m.group("body") for m in bench_doc.BLOCK.finditer(doc))
    assert "| trainer_vs_bare |" in generated and "| trainer_vs_bare |" not in bench_doc.prose(doc)
    assert stray(bench_doc.prose(doc), generated + json.dumps(results["settings"])) == []
    # The check can fail: a figure written into the prose is found.
    assert stray(bench_doc.prose(doc) + " the sweep took 26.1 s", generated) == ["26.1"]


@pytest.mark.slow
def test_benchmarks_doc_marks_entries_without_provenance_and_renders_a_new_run(tiny_results):
    _, results, _ = tiny_results
    doc = bench_doc.DOC.read_text()
    fresh = bench_doc.render(doc, results)
    assert BEFORE_PROVENANCE not in fresh and results["benchmarks"]["data_prep"]["provenance"]["date"] in fresh
    legacy = {**results, "benchmarks": {**results["benchmarks"], "data_prep": {
        k: v for k, v in results["benchmarks"]["data_prep"].items() if k != "provenance"} | {"timestamp": "then"}}}
    rows = [r for r in bench_doc.render(doc, legacy).splitlines() if r.startswith("| data_prep | then |")]
    assert rows == [f"| data_prep | then | {BEFORE_PROVENANCE} | - | - |"]
    with pytest.raises(ValueError, match="missing \\['sweep'\\]"):
        bench_doc.render(doc.replace("<!-- bench.doc: sweep -->", ""), results)


def test_the_make_sweep_point_times_the_makefiles_grid():
    from smallinit.bench.base.common import FULL

    grid = re.search(r"^SWEEP_GRID \?= (.*)$", (REPO / "Makefile").read_text(), re.M).group(1).split()
    assert list(FULL.make_sweep_grid) == grid and not FULL.make_sweep_overrides


def test_overhead_fit_recovers_a_line():
    fit = _fit([4, 8, 16, 8], [10 + 2.5 * n for n in (4, 8, 16, 8)])
    assert fit["fixed_s"] == pytest.approx(10) and fit["per_trial_s"] == pytest.approx(2.5)
    assert _fit([8, 8], [1.0, 2.0]) is None


def test_timed_calls_accumulates_and_restores():
    class Box:
        def work(self, x):
            time.sleep(0.01)
            return x * 2

    original = Box.work
    with timed_calls({"work": (Box, "work"), "gone": (Box, "missing")}) as spent:
        assert Box().work(3) == 6 and Box().work(1) == 2
    assert Box.work is original and "gone" not in spent
    assert 0.02 <= spent["work"] < 1.0
    assert rotate([1, 2, 3], 1) == [2, 3, 1] and rotate([1, 2, 3], 3) == [1, 2, 3]


def test_the_pool_baseline_runs_at_the_niceness_ray_gives_its_workers():
    """On a busy machine a pool at nice 0 would win the cores the sweep's nice-15 Ray workers lose."""
    import concurrent.futures as cf
    import multiprocessing

    from smallinit.bench.sweep_bench import RAY_WORKER_NICENESS, _pool_init

    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=_pool_init) as pool:
        assert pool.submit(os.nice, 0).result() == max(RAY_WORKER_NICENESS, os.nice(0))


def test_bench_doc_names_the_file_that_is_damaged(tmp_path, capsys):
    bad = tmp_path / "results.json"
    bad.write_text('{"benchmarks": ')
    assert bench_doc.main(["--check", "--results", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: ") and err.count("\n") == 1


@pytest.mark.parametrize("args, says", [
    (["--repeats", "0"], "argument --repeats: '0' is invalid: a whole number of at least 1"),
    (["--threads", "-2"], "argument --threads: '-2' is invalid: a whole number of at least 1"),
    (["--out", "{file}"], "--out={file} is invalid: it is a file; give a folder (nothing was measured)"),
])
def test_bench_refuses_bad_arguments_before_measuring(tmp_path, capsys, args, says):
    from smallinit.bench.__main__ import parse

    a_file = tmp_path / "results"
    a_file.write_text("mine")
    with pytest.raises(SystemExit) as e:
        parse(["--tiny", *[a.format(file=a_file) for a in args]])
    assert e.value.code == 2 and says.format(file=a_file) in capsys.readouterr().err
    assert a_file.read_text() == "mine"


@pytest.mark.parametrize("content", ["{}", "[]", '{"benchmarks": {}}'])
def test_bench_doc_refuses_a_json_that_is_not_a_bench_record(tmp_path, capsys, content):
    bad = tmp_path / "results.json"
    bad.write_text(content)
    assert bench_doc.main(["--check", "--results", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {bad}: not a bench record (a JSON object with benchmarks and machine, as make bench writes)\n"
