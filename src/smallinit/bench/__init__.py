"""Benchmarks: what the instrument (trial loop, probes, sweeper) costs, against bare baselines
measured side by side in the same run.

    python -m smallinit.bench                       the full set (micro preset, ~30 min on 2 CPU cores)
    python -m smallinit.bench --tiny                a seconds-scale smoke run (CI checks its output's shape)
    python -m smallinit.bench --only gpu_mfu        one or more benchmarks, comma-separated

Every figure is a ratio of medians (or a median of paired ratios) over repeats in which the
baseline and the measured run alternate (ABAB...), so load from other work on the machine
hits both sides. Results go to bench/results.json and bench/results.md (see bench/report.py).

The overhead benchmarks (trainer_bench, sweep_bench, dp_bench, data_bench), the runner
(__main__), the record (report) and docs/benchmarks.md (doc) sit here; base/ holds what they
share, cpu/ and gpu/ the benchmarks of one kind of machine.
"""

BENCHMARKS = ("trainer_vs_bare", "probe_overhead", "sweep_overhead", "sweep_overhead_make_sweep", "dp_scaling", "data_prep",
              "cpu_bf16_speedup", "cpu_mfu", "cpu_mfu_by_width", "cpu_allocator", "cpu_compile", "trainer_vs_reference", "crossover_end_to_end",
              "cpu_precision_check", "gpu_mfu")
