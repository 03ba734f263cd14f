"""python -m bench [--tiny] [--only a,b] [--out DIR] [--repeats N] [--threads N]"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path

from . import BENCHMARKS
from .common import FULL, TINY, machine_info, progress

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--tiny", action="store_true", help="nano model, few steps, 1 repeat, small sweeps (CI)")
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent, help="folder for results.json/.md")
    p.add_argument("--repeats", type=int, help="repeats of trainer_vs_bare/probe_overhead (default 3; tiny 1)")
    p.add_argument("--threads", type=int, help="torch threads of every measured run (default 1)")
    args = p.parse_args(argv)
    args.selected = [s.strip() for s in args.only.split(",") if s.strip()] or list(BENCHMARKS)
    unknown = [s for s in args.selected if s not in BENCHMARKS]
    if unknown:
        p.error(f"--only: unknown benchmark {unknown[0]!r}; one of {', '.join(BENCHMARKS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    settings = TINY if args.tiny else FULL
    changes = {k: v for k, v in (("repeats", args.repeats), ("threads", args.threads)) if v is not None}
    settings = dataclasses.replace(settings, **changes)
    selected = set(args.selected)
    machine = machine_info()
    where = machine["gpu"] or f"{machine['cpu_count']} CPUs"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    benchmarks: dict[str, dict] = {}
    t_start = time.perf_counter()

    def attempt(names: list[str], fn) -> None:
        names = [n for n in names if n in selected]
        if not names:
            return
        t0 = time.perf_counter()
        try:
            got = fn(set(names))
        except Exception as e:  # noqa: BLE001 - recorded, and the exit status says so
            traceback.print_exc()
            got = {n: {"error": f"{type(e).__name__}: {e}"} for n in names}
        for n in names:
            benchmarks[n] = {**got[n], "machine": where, "timestamp": stamp}
        progress(",".join(names), f"done in {time.perf_counter() - t0:.0f} s")

    from . import (
        allocator_bench,
        compile_bench,
        cpu_bench,
        cpu_width_bench,
        data_bench,
        gpu_bench,
        sweep_bench,
        trainer_bench,
    )

    attempt(["data_prep"], lambda _: {"data_prep": data_bench.run(settings)})
    attempt(["trainer_vs_bare", "probe_overhead"], lambda names: trainer_bench.run(settings, names))
    attempt(["cpu_bf16_speedup", "cpu_mfu"], lambda names: cpu_bench.run(settings, names))
    attempt(["cpu_mfu_by_width"], lambda _: {"cpu_mfu_by_width": cpu_width_bench.run(settings)})
    attempt(["cpu_allocator"], lambda _: {"cpu_allocator": allocator_bench.run(settings)})
    attempt(["cpu_compile"], lambda _: {"cpu_compile": compile_bench.run(settings)})
    attempt(["sweep_overhead", "sweep_overhead_make_sweep"], lambda names: sweep_bench.split(sweep_bench.run(settings), names))
    attempt(["gpu_mfu"], lambda _: {"gpu_mfu": gpu_bench.run(settings)})

    previous = args.out / "results.json"
    if len(selected) < len(BENCHMARKS) and previous.exists():
        kept = json.loads(previous.read_text()).get("benchmarks", {})
        benchmarks = {n: benchmarks.get(n) or kept[n] for n in BENCHMARKS if n in benchmarks or n in kept}
    for n in BENCHMARKS:
        benchmarks.setdefault(n, {"skipped": "not selected (--only)", "machine": where, "timestamp": stamp})
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
