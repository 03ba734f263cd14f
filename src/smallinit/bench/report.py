"""results.json and the markdown tables (results.md), from the benchmark entries.

results.json, written whole by one run:
    {"machine": {...}, "timestamp": ..., "settings": {...},
     "benchmarks": {name: ({"ratio" (or values), "target": {"op", "value"} | null, "pass": bool | null,
                            "baseline": {...}, "measured": {...}, "repeats": n, ...}
                           | {"skipped": reason} | {"error": message})
                          + {"provenance": core.provenance.record() with the bench's machine keys}}}
Entries written before provenance was recorded carry only "machine" (a CPU count or GPU name)
and "timestamp"; the tables say so instead of filling in what they lack.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from smallinit.core import written
from smallinit.core.markdown import table as md_table

from . import BENCHMARKS


def _target(t: dict | None) -> str:
    return f"{'≥' if t['op'] == '>=' else '≤'} {t['value']:g}" if t else "-"


def _verdict(entry: dict) -> str:
    if "skipped" in entry:
        return "SKIP"
    if "error" in entry:
        return "ERROR"
    return {True: "PASS", False: "MISS"}.get(entry.get("pass"), "-")


def _f(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def rows(benchmarks: dict[str, dict], only_present: bool = False) -> list[list[str]]:
    out = []
    for name in BENCHMARKS:
        e = benchmarks.get(name)
        if e is None and only_present:
            continue
        if e is None:  # a benchmark added after this record's run
            out.append([name, "-", "-", NOT_MEASURED, "-", "-", "-", "no entry in this results file"])
            continue
        if "skipped" in e or "error" in e:
            out.append([name, "-", _target(e.get("target")), _verdict(e), "-", "-", "-",
                        (e.get("skipped") or e.get("error", "")).splitlines()[0]])
            continue
        b, m = e.get("baseline", {}), e.get("measured", {})
        if name == "trainer_vs_bare":
            out.append([name, _f(e["ratio"]), _target(e["target"]), _verdict(e),
                        f"bare loop {b['tokens_per_s']:,.0f} tok/s", f"run_trial {m['tokens_per_s']:,.0f} tok/s",
                        str(e["repeats"]),
                        f"range {_f(min(e['paired_ratios']), '.2f')}-{_f(max(e['paired_ratios']), '.2f')}; "
                        f"step time only {_f(e['ratio_steps'])}; end to end {_f(e['ratio_end_to_end'])} "
                        f"(validation {e['eval_share']:.0%} of the trial's wall time); in-run share of "
                        f"non-validation time in optimizer steps {_f(e['ratio_direct'])}"])
        elif name == "probe_overhead":
            out.append([name, _f(e["ratio"]), _target(e["target"]), _verdict(e),
                        f"less probes {b['training_s']:.1f} s", f"with probes {m['training_s']:.1f} s", str(e["repeats"]),
                        f"{m['probe_s']:.2f} s in run_probes, timed inside the run; separate runs with "
                        f"train.probe_every=0 give {_f(e['ratio_paired_runs'])} (range {_f(min(e['paired_ratios']), '.2f')}"
                        f"-{_f(max(e['paired_ratios']), '.2f')}: load noise)"])
        elif name == "sweep_overhead":
            fit = e.get("fit") or {}
            note = (f"first trial runs after {m['to_first_trial_s']:.1f} s; per trial: worker dispatch "
                    f"{_f(m['worker_dispatch_s'], '.1f')} s, W&B init {_f(m['trial_setup_s'], '.1f')} s, "
                    f"run_trial {m['run_trial_s']:.1f} s in the sweep vs {b['trial_s']:.1f} s in the pool; "
                    f"driver peak {e['driver_peak_rss_mb']:.0f} MB (all Ray processes {e['tree_peak_rss_mb']:.0f} MB)")
            if "worker_processes" in m:
                note += f"; {m['worker_processes']:.0f} Ray worker processes ran the {m['trials']} trials"
            if fit:
                note += f"; fit: {fit['fixed_s']:.1f} s once + {fit['per_trial_s']:.2f} s per trial"
            if "marginal_ratio" in e:
                note += f" (each added trial costs {_f(e['marginal_ratio'], '.2f')}x its ideal share)"
            if "wandb_disabled_ratio" in e:
                note += f"; W&B disabled {_f(e['wandb_disabled_ratio'], '.2f')}"
            out.append([f"{name} ({e['concurrency']} at once)", _f(e["ratio"], ".2f"), _target(e["target"]), _verdict(e),
                        f"ideal {b['ideal_s']:.1f} s", f"sweep {m['wall_s']:.1f} s", str(e["repeats"]), note])
            for s in e["series"]:
                out.append([f"  {s['trials']} trials", _f(s["ratio"], ".2f"), "-", "-", f"ideal {s['ideal_s']:.1f} s",
                            f"sweep {s['wall_s']:.1f} s", str(s["repeats"]),
                            f"overhead {s['overhead_s']:.1f} s; driver peak {s['driver_peak_rss_mb']:.0f} MB"])
            ms = e.get("make_sweep")
            if ms:
                out.append([f"  `make sweep` grid ({ms['trials']} trials)", _f(ms["ratio"], ".2f"), "-", "-",
                            f"ideal {ms['ideal_s']:.1f} s", f"sweep {ms['wall_s']:.1f} s", "1",
                            f"overhead {ms['wall_s'] - ms['ideal_s']:.1f} s; first trial runs after "
                            f"{ms['to_first_trial_s']:.1f} s; run_trial {ms['run_trial_s']:.1f} s in the sweep vs "
                            f"{ms['trial_s']:.1f} s in the pool"
                            + (" (ideal: mean of the pool runs before and after, {:.1f} and {:.1f} s)".format(*ms["pool_ideals_s"])
                               if "pool_ideals_s" in ms else "")])
        elif name == "sweep_overhead_make_sweep":
            out.append([name, _f(e["ratio"], ".2f"), _target(e["target"]), _verdict(e), f"ideal {e['ideal_s']:.1f} s",
                        f"sweep {e['wall_s']:.1f} s", "1", f"{e['trials']} default trials (`make sweep`'s grid)"])
        elif name == "dp_scaling":
            w = [f"{x['workers']} worker{'s' if x['workers'] > 1 else ''} x {x['threads']} thread{'s' if x['threads'] > 1 else ''}"
                 for x in (b, m)]
            out.append([name, _f(e["ratio"], ".2f"), "-", "recorded", f"{w[0]} {b['tokens_per_s']:,.0f} tok/s",
                        f"{w[1]} (ddp, gloo) {m['tokens_per_s']:,.0f} tok/s", str(e["repeats"]),
                        f"range {_f(min(e['paired_ratios']), '.2f')}-{_f(max(e['paired_ratios']), '.2f')}; "
                        f"{e['steps']} steps x {e['tokens_per_step']} tokens ({e['dtype']}), optimizer steps' own time; "
                        f"sweep wall time {b['sweep_wall_s']:.1f} s -> {m['sweep_wall_s']:.1f} s; {e['note']}"])
        elif name == "cpu_bf16_speedup":
            out.append([name, _f(e["ratio"], ".2f"), "-", "recorded", f"fp32 {b['tokens_per_s']:,.0f} tok/s",
                        f"bf16 {m['tokens_per_s']:,.0f} tok/s", str(e.get("repeats", "-")),
                        f"dtype=auto picks {e['auto_choice']} ({e['auto_reason']})" + (f"; {e['note']}" if e.get("note") else "")])
        elif name == "cpu_mfu":
            out.append([name, _f(e["ratio"], ".2f"), _target(e["target"]), _verdict(e),
                        f"{b['n']}^3 matmul {b['matmul_gflops']:.0f} GFLOP/s ({b['dtype']})",
                        f"run_trial {e['ratio'] * b['matmul_gflops']:.0f} GFLOP/s", str(len(m["repeats"])),
                        "model FLOPs by PaLM's count over the training steps' own time"])
        elif name == "cpu_mfu_by_width":
            out.append([name, _f(e["ratio"], ".2f"), _target(e["target"]), _verdict(e), f"{b['n']}^3 matmul ({e['dtype']})",
                        "bare loop", str(e["repeats"]), "lowest over the widths (scaling_law's shape)"
                        + (f"; {e['note']}" if e.get("note") else "")])
            for d, w in e["widths"].items():
                out.append([f"  d={d}", _f(w["mfu"], ".2f"), _target(e["target"]), {True: "PASS", False: "MISS"}[w["pass"]],
                            f"{w['matmul_gflops']:.0f} GFLOP/s", f"{w['tokens_per_s']:,.0f} tok/s, "
                            f"{w['mfu'] * w['matmul_gflops']:.0f} GFLOP/s", str(len(w["runs"])),
                            f"{w['params'] / 1e6:.2f}M parameters, {w['flops_per_token'] / 1e6:.1f} MFLOP/token; "
                            + (f"compiled {w['compiled_tokens_per_s']:,.0f} tok/s, MFU {w['compiled_mfu']:.3f}; "
                               if "compiled_mfu" in w else "") +
                            f"range {_f(w['spread'][0], '.2f')}-{_f(w['spread'][1], '.2f')}"])
        elif name == "cpu_allocator":
            out.append([name, _f(e["ratio"], ".2f"), "-", "recorded",
                        f"glibc defaults {b['tokens_per_s']:,.0f} tok/s", f"freed memory kept {m['tokens_per_s']:,.0f} tok/s",
                        str(e["repeats"]),
                        f"page faults per step {b['faults_per_step']:,.0f} -> {m['faults_per_step']:,.0f}; system time per "
                        f"step {b['sys_s_per_step'] * 1000:.0f} -> {m['sys_s_per_step'] * 1000:.0f} ms; peak RSS "
                        f"{b['peak_rss_mb']:.0f} -> {m['peak_rss_mb']:.0f} MB over the timed steps; fresh process each"])
        elif name == "cpu_compile":
            cold = f"; cold cache {m['wall_s_cold']:.1f} s ({e['cold_ratio']:.2f}x)" if m.get("wall_s_cold") else ""
            out.append([name, _f(e["ratio"], ".2f"), "-", "recorded", f"eager {b['wall_s']:.1f} s",
                        f"compiled {m['wall_s_warm']:.1f} s", str(e["repeats"]),
                        f"{e['steps']} steps, fresh process each{cold}; steps alone {e['step_ratio']:.2f}x; {e['decision']}"])
        elif name == "trainer_vs_reference":
            out.append([name, _f(e["ratio"]), _target(e["target"]), _verdict(e), "reference loop (compiled)",
                        "run_trial (train.compile=true)", str(e["repeats"]),
                        f"lower of the widths, {e['dtype']} ({e['dtype_reason']})"])
            for d, w in e["shapes"].items():
                out.append([f"  {d}", _f(w["ratio"]), _target(e["target"]), {True: "PASS", False: "MISS"}[w["ratio"] >= e["target"]["value"]],
                            f"{w['reference_tokens_per_s']:,.0f} tok/s, MFU {w['reference_mfu']:.3f} of {w['matmul_gflops']:.0f} GFLOP/s",
                            f"{w['trainer_tokens_per_s']:,.0f} tok/s", str(len(w["runs"]["trainer"])),
                            f"{w['model']}; range {_f(w['spread'][0], '.2f')}-{_f(w['spread'][1], '.2f')}"])
        elif name == "crossover_end_to_end":
            out.append([name, _f(e["ratio"], ".2f"), _target(e["target"]), _verdict(e),
                        f"eager fp32 {b['wall_s']:.0f} s ({b['tokens_per_s']:,.0f} tok/s)",
                        f"auto {m['wall_s']:.0f} s ({m['tokens_per_s']:,.0f} tok/s)", "1",
                        f"steps alone {e['steps_ratio']:.2f}x; the trainer chose {m['dtype']} ({m['dtype_reason']}); {m['compile']}"])
        elif name == "cpu_precision_check":
            out.append([name, _f(e["ratio"], ".3f"), _target(e["target"]), _verdict(e),
                        f"plain timing bf16/fp32 {b['plain_ratio']:.2f}x", f"the dtype check {m['check_ratio']:.2f}x", "1",
                        f"fp32 {m['fp32_gflops']:.0f}, bf16 {m['bf16_gflops']:.0f} GFLOP/s (the check); figure = |check / plain - 1|"])
        elif name == "data_prep":
            c = e["corpus"]
            out.append([name, f"{e['cold_s']:.2f} s cold / {e['warm_s'] * 1000:.1f} ms warm", "-", "-",
                        "empty cache", "cache hit", str(e["repeats"]),
                        f"{c['name']} corpus, vocab {c['vocab_size']}, {c['train_tokens'] + c['val_tokens']:,} tokens"])
        elif name == "gpu_mfu":
            out.append([name, _f(e["ratio"], ".1%"), _target(e["target"]), _verdict(e), "-", "-", str(e["repeats"]),
                        "lowest over the presets"])
            for preset, r in e["presets"].items():
                if "error" in r:
                    out.append([f"  {preset}", "-", "-", "ERROR", "-", "-", "-", r["error"]])
                    continue
                out.append([f"  {preset}", _f(r["mfu"], ".1%"), _target(e["target"]), "-", "-",
                            f"{r['tokens_per_s']:,.0f} tok/s", str(r["steps"]),
                            f"batch {r['batch_size']}x{r['seq_len']}, {r['max_memory_gb']:.0f} GB"])
    return out


HEADER = ["benchmark", "figure", "target", "result", "baseline", "measured", "repeats", "notes"]
PROVENANCE_HEADER = ["benchmark", "date", "commit", "machine", "CPU flags"]
BEFORE_PROVENANCE = "recorded before provenance (rerun make bench)"
NOT_MEASURED = "not measured yet"


def provenance_rows(benchmarks: dict[str, dict], only_present: bool = False) -> list[list[str]]:
    out = []
    for name in BENCHMARKS:
        e = benchmarks.get(name)
        if e is None and only_present:
            continue
        if e is None:
            out.append([name, "-", NOT_MEASURED, "-", "-"])
            continue
        p = e.get("provenance")
        if p is None:
            out.append([name, e.get("timestamp", "-"), BEFORE_PROVENANCE, e.get("machine", "-"), "-"])
            continue
        commit = "not a git checkout" if p["commit"] is None else f"`{p['commit'][:12]}`"
        if p.get("uncommitted"):
            shown = ", ".join(p["uncommitted"][:3]) + (f" and {len(p['uncommitted']) - 3} more" if len(p["uncommitted"]) > 3 else "")
            commit += f" with uncommitted changes to {shown}"
        m = p["machine"]
        where = f"{m['gpu']}, " if m.get("gpu") else ""
        where += f"{m.get('cpu_count')} CPUs ({m.get('cpu_model') or 'unknown model'}), torch {m.get('torch')}"
        out.append([name, p["date"], commit, where, " ".join(m["cpu_flags"]) or "none of core.provenance.CPU_FLAGS"])
    return out


def table(header: list[str], body: list[list[str]]) -> list[str]:
    return md_table(header, body).splitlines()


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Benchmarks", "",
             f"`python -m smallinit.bench` ({results['settings']['mode']}), {results['timestamp']}. Each figure is measured "
             "against a baseline run alternately with it in the same run (medians over repeats); "
             "see docs/benchmarks.md.", ""]
    lines += table(HEADER, rows(results["benchmarks"]))
    lines += ["", "Where each entry came from:", ""] + table(PROVENANCE_HEADER, provenance_rows(results["benchmarks"]))
    m = results["machine"]
    lines += ["", f"Machine: {m.get('cpu_count')} CPUs ({m.get('cpu_model')}), torch {m.get('torch')}, "
                  f"CUDA {m.get('cuda') or 'none'}{', ' + m['gpu'] if m.get('gpu') else ''}; "
                  f"load average at start {m.get('loadavg_at_start')}.", ""]
    return "\n".join(lines)


OUTPUTS = ("results.json", "results.md")


def write(results: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """The run's record; `python -m smallinit.bench` checked before its first benchmark that it may
    write over these two files (core/written.py)."""
    json_path, md_path = written.write_outputs(
        out_dir, dict(zip(OUTPUTS, (json.dumps(_finite(results), indent=2) + "\n", markdown(results)))),
        by="smallinit.bench", adopt=True)
    return json_path, md_path


def _finite(x: Any) -> Any:
    """JSON has no NaN or inf: write null instead."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x
