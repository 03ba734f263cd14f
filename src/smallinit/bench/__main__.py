"""python -m smallinit.bench [--tiny] [--only a,b] [--out DIR] [--repeats N] [--threads N]

Writes DIR/results.json whole, every entry from this run with its provenance, and
DIR/results.md. bench/results.json (the default DIR) is the record docs/benchmarks.md is
generated from, so only a full run writes there: --tiny and --only need --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback
from pathlib import Path

from smallinit.core import written
from smallinit.core.errors import ConfigError

from . import BENCHMARKS
from .base.common import FULL, TINY, machine_info, progress, provenance
from .report import OUTPUTS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
RECORD = Path(__file__).resolve().parents[3] / "bench"  # the record stays in the repository's bench/


def _positive(text: str) -> int:
    value = int(text) if text.strip().lstrip("+").isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: a whole number of at least 1")
    return value


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m smallinit.bench", description=__doc__)
    p.add_argument("--tiny", action="store_true", help="nano model, few steps, 1 repeat, small sweeps (CI)")
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    p.add_argument("--out", type=Path, default=RECORD, help="folder for results.json/.md (default: the record, bench/)")
    p.add_argument("--repeats", type=_positive, help="repeats of trainer_vs_bare/probe_overhead (default 3; tiny 1)")
    p.add_argument("--threads", type=_positive, help="torch threads of every measured run (default 1)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace results.json/.md in --out where no smallinit command wrote them, or they were edited")
    args = p.parse_args(argv)
    args.selected = [s.strip() for s in args.only.split(",") if s.strip()] or list(BENCHMARKS)
    unknown = [s for s in args.selected if s not in BENCHMARKS]
    if unknown:
        p.error(f"--only: unknown benchmark {unknown[0]!r}; one of {', '.join(BENCHMARKS)}")
    partial = [flag for flag, on in (("--tiny", args.tiny), (f"--only={args.only}", bool(args.only))) if on]
    if partial and args.out.resolve() == RECORD:
        p.error(f"{partial[0]} is invalid without --out DIR: bench/results.json holds one whole `make bench` "
                "run, so a part or a tiny run goes to a folder of its own")
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out={args.out} is invalid: it is a file; give a folder (nothing was measured)")
    try:  # before the first benchmark: a refusal after an hour of measuring would waste it
        written.check(args.out, list(OUTPUTS), args.overwrite)
    except ConfigError as e:
        p.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    settings = TINY if args.tiny else FULL
    changes = {k: v for k, v in (("repeats", args.repeats), ("threads", args.threads)) if v is not None}
    settings = dataclasses.replace(settings, **changes)
    selected = set(args.selected)
    machine = machine_info()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    benchmarks: dict[str, dict] = {}
    t_start = time.perf_counter()

    def attempt(names: list[str], fn) -> None:
        names = [n for n in names if n in selected]
        if not names:
            return
        started = provenance(machine)
        t0 = time.perf_counter()
        try:
            got = fn(set(names))
        except Exception as e:  # noqa: BLE001 - recorded, and the exit status says so
            traceback.print_exc()
            got = {n: {"error": f"{type(e).__name__}: {e}"} for n in names}
        for n in names:
            benchmarks[n] = {**got[n], "provenance": started}
        progress(",".join(names), f"done in {time.perf_counter() - t0:.0f} s")

    from . import data_bench, dp_bench, sweep_bench, trainer_bench
    from .cpu import allocator_bench, compile_bench, cpu_bench, cpu_width_bench, speed_bench
    from .gpu import gpu_bench

    attempt(["data_prep"], lambda _: {"data_prep": data_bench.run(settings)})
    attempt(["trainer_vs_bare", "probe_overhead"], lambda names: trainer_bench.run(settings, names))
    attempt(["cpu_bf16_speedup", "cpu_mfu"], lambda names: cpu_bench.run(settings, names))
    attempt(["cpu_mfu_by_width"], lambda _: {"cpu_mfu_by_width": cpu_width_bench.run(settings)})
    attempt(["cpu_allocator"], lambda _: {"cpu_allocator": allocator_bench.run(settings)})
    attempt(["cpu_compile"], lambda _: {"cpu_compile": compile_bench.run(settings)})
    attempt(["cpu_precision_check"], lambda _: {"cpu_precision_check": speed_bench.cpu_precision_check(settings)})
    attempt(["trainer_vs_reference"], lambda _: {"trainer_vs_reference": speed_bench.trainer_vs_reference(settings)})
    attempt(["crossover_end_to_end"], lambda _: {"crossover_end_to_end": speed_bench.crossover_end_to_end(settings)})
    attempt(["sweep_overhead", "sweep_overhead_make_sweep"], lambda names: sweep_bench.split(sweep_bench.run(settings), names))
    attempt(["dp_scaling"], lambda _: {"dp_scaling": dp_bench.run(settings)})
    attempt(["gpu_mfu"], lambda _: {"gpu_mfu": gpu_bench.run(settings)})

    not_selected = provenance(machine)
    benchmarks = {n: benchmarks.get(n) or {"skipped": "not selected (--only)", "provenance": not_selected}
                  for n in BENCHMARKS}
    results = {"machine": machine, "timestamp": stamp,
               "settings": {**{k: v for k, v in dataclasses.asdict(settings).items() if k != "extra"},
                            "selected": sorted(selected), "elapsed_s": time.perf_counter() - t_start},
               "benchmarks": benchmarks}
    from .report import markdown, write

    json_path, md_path = write(results, args.out)
    print()
    print(markdown(results))
    print(f"wrote {json_path} and {md_path} in {time.perf_counter() - t_start:.0f} s")
    return 1 if any("error" in b for b in benchmarks.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
