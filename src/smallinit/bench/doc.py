"""docs/benchmarks.md's tables, generated from bench/results.json.

    python -m smallinit.bench.doc            rewrite the generated blocks of docs/benchmarks.md
    python -m smallinit.bench.doc --check    exit 1 if docs/benchmarks.md is not what results.json gives

The page's prose is written by hand and quotes no measured figure; every figure sits in a
block between `<!-- bench.doc: NAME -->` and `<!-- end NAME -->`, rewritten here whole.
`make bench` runs this after writing results.json.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from smallinit.core.errors import first_line
from smallinit.core.files import atomic_write

from .base.common import REPO
from .report import HEADER, PROVENANCE_HEADER, provenance_rows, rows, table

RESULTS = REPO / "bench" / "results.json"
DOC = REPO / "docs" / "benchmarks.md"
BLOCK = re.compile(r"(<!-- bench\.doc: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end (?P=name) -->)", re.S)


def _provenance(results: dict[str, Any]) -> list[str]:
    return table(PROVENANCE_HEADER, provenance_rows(results["benchmarks"]))


def _results(results: dict[str, Any]) -> list[str]:
    return table(HEADER, rows(results["benchmarks"]))


def _sweep(results: dict[str, Any]) -> list[str]:
    """sweep_overhead's points, its fit, and where the CPU went in the `make sweep` point."""
    e = results["benchmarks"].get("sweep_overhead", {})
    if "series" not in e:
        return [f"sweep_overhead was not measured: {e.get('skipped') or e.get('error') or 'no entry'}."]
    m, b = e["measured"], e["baseline"]
    out = table(["trials (2 at once)", "sweep", "ideal", "ratio", "overhead", "driver peak", "repeats"],
                [[str(s["trials"]), f"{s['wall_s']:.1f} s", f"{s['ideal_s']:.1f} s", f"{s['ratio']:.2f}",
                  f"{s['overhead_s']:.1f} s", f"{s['driver_peak_rss_mb']:.0f} MB", str(s["repeats"])] for s in e["series"]])
    facts = []
    if e.get("fit"):
        facts.append(f"fit over the points: {e['fit']['fixed_s']:.1f} s once per command + "
                     f"{e['fit']['per_trial_s']:.2f} s per trial")
    facts.append(f"at {m['trials']} trials the first trial runs {m['to_first_trial_s']:.1f} s after the command; "
                 f"`run_trial` takes {m['run_trial_s']:.1f} s in the sweep against {b['trial_s']:.1f} s in the pool")
    if "wandb_disabled_ratio" in e:
        facts.append(f"with W&B disabled the {m['trials']}-trial ratio is {e['wandb_disabled_ratio']:.2f}")
    facts.append(f"peak memory: the driver {e['driver_peak_rss_mb']:.0f} MB, the driver and every Ray process "
                 f"{e['tree_peak_rss_mb']:.0f} MB")
    out += [""] + [f"- {f}." for f in facts]
    ms = e.get("make_sweep")
    if ms:
        out += ["", f"The `make sweep` point ({ms['trials']} default trials, W&B {ms.get('wandb', 'offline')}):", ""]
        slower = ms["run_trial_s"] / ms["trial_s"] - 1
        pool = ms.get("pool_ideals_s")
        out += table(["measure", "value"], [
            ["`make sweep` wall time", f"{ms['wall_s']:.1f} s"],
            [f"ideal (the pool's trial times / {e.get('concurrency', '-')})" + (": mean of the runs before and after" if pool else ""),
             f"{ms['ideal_s']:.1f} s" + (f" ({pool[0]:.1f} s before, {pool[1]:.1f} s after)" if pool else "")],
            ["ratio", f"{ms['ratio']:.2f}"],
            ["first trial runs after", f"{ms['to_first_trial_s']:.1f} s"],
            ["`run_trial` in the sweep / in the pool", f"{ms['run_trial_s']:.1f} s / {ms['trial_s']:.1f} s ({slower:+.0%})"],
        ])
        roles = ms.get("cpu_s_by_role")
        if roles:
            total = sum(roles.values())
            threads = ms.get("cpu_s_worker_threads", {})
            rows_ = [[role, f"{s:.1f}", f"{s / total:.1%}"] for role, s in sorted(roles.items(), key=lambda kv: -kv[1])]
            out += ["", f"CPU seconds of the `make sweep` point by process ({total:.1f} in all):", ""]
            out += table(["process", "CPU-s", "share"], rows_)
            if threads:
                top = sorted(threads.items(), key=lambda kv: -kv[1])
                rest = sum(s for _, s in top[2:])
                out += ["", "Inside the trial workers, by thread: "
                        + ", ".join(f"`{t}` {s:.1f}" for t, s in top[:2]) + f", the other threads {rest:.1f} CPU-s."]
    return out


def _measured_only(results: dict[str, Any]) -> dict[str, Any]:
    """A partial run's results with the entries it did not select left out."""
    return {**results, "benchmarks": {k: v for k, v in results["benchmarks"].items() if "skipped" not in v
                                      or not v["skipped"].startswith("not selected")}}


# Blocks from the full record (bench/results.json), and from the AMX machine's partial record
# (bench/amx/results.json): the figures of one machine kind are never mixed with another's.
BLOCKS = {"provenance": _provenance, "results": _results, "sweep": _sweep,
          "amx-results": lambda r: table(HEADER, rows(_measured_only(r)["benchmarks"], only_present=True)),
          "amx-provenance": lambda r: table(PROVENANCE_HEADER, provenance_rows(_measured_only(r)["benchmarks"], only_present=True))}
AMX_RESULTS = REPO / "bench" / "amx" / "results.json"


def render(doc: str, results: dict[str, Any], amx: dict[str, Any] | None = None) -> str:
    """`doc` with each generated block rewritten from `results` (the amx- blocks from `amx`);
    every block must be there."""
    found = {m.group("name") for m in BLOCK.finditer(doc)}
    missing, unknown = sorted(set(BLOCKS) - found), sorted(found - set(BLOCKS))
    if missing or unknown:
        raise ValueError(f"generated blocks: missing {missing}, unknown {unknown}; allowed {sorted(BLOCKS)}")

    def body(name: str) -> list[str]:
        if name.startswith("amx-"):
            return BLOCKS[name](amx) if amx else ["No record from a CPU with AMX yet (bench/amx/results.json)."]
        return BLOCKS[name](results)

    return BLOCK.sub(lambda m: m.group(1) + "\n" + "\n".join(body(m.group("name"))) + "\n\n" + m.group(4), doc)


def prose(doc: str) -> str:
    """The hand-written part of the page: the generated blocks and code blocks taken out."""
    return re.sub(r"```.*?```", "", BLOCK.sub("", doc), flags=re.S)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m smallinit.bench.doc", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the page differs from what results.json gives")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--doc", type=Path, default=DOC)
    a = p.parse_args(argv)
    reading = a.results
    try:  # each file read on its own, so the error names the one that failed
        results = json.loads(a.results.read_text())
        if not isinstance(results, dict) or not {"benchmarks", "machine"} <= set(results):
            raise ValueError("not a bench record (a JSON object with benchmarks and machine, as make bench writes)")
        reading = AMX_RESULTS
        amx = json.loads(AMX_RESULTS.read_text()) if AMX_RESULTS.exists() else None
        reading = a.doc
        text = render(a.doc.read_text(), results, amx)
    except (OSError, ValueError) as e:
        print(f"error: {reading}: {first_line(e)}", file=sys.stderr)
        return 1
    if a.check:
        if a.doc.read_text() != text:
            print(f"error: {a.doc} is not what {a.results} gives; run python -m smallinit.bench.doc", file=sys.stderr)
            return 1
        print(f"{a.doc} matches {a.results}")
        return 0
    atomic_write(a.doc, lambda f: f.write(text.encode()))  # the prose as read; only the marked blocks change
    print(f"wrote {a.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
