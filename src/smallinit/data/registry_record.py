"""The record docs/data.md quotes: data=registry fetched (or found) and prepared at its defaults,
each source's pins and counts, with the provenance of the run that measured them.

    python -m smallinit.data.registry_record      # writes docs/data/registry_corpus.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from smallinit.core import written
from smallinit.core.errors import ConfigError
from smallinit.core.provenance import record as provenance

from .config import RegistryData
from .pipeline import prepare
from .registry_corpus import FETCH, MANIFEST, SOURCES, FetchError, fetch

OUT = Path("docs/data/registry_corpus.json")
BY = "python -m smallinit.data.registry_record"


def measure(cache_dir: str, out: Path, log=print, overwrite: bool = False) -> dict:
    written.check(out.parent, [out.name], overwrite)  # before the fetch: a refusal costs nothing
    root = fetch(cache_dir, log)
    data = prepare(RegistryData(cache_dir=cache_dir), log=log)
    manifest, meta = json.loads((root / MANIFEST).read_text()), data.meta
    doc = {"about": f"data=registry at its defaults: `{FETCH}`, then prepare(RegistryData()). Per source: the "
                    "fetched documents and characters, then each side's documents, characters and tokens after dedupe",
           "command": "python -m smallinit.data.registry_record", "provenance": provenance(),
           "fetch_seconds": manifest["seconds"], "prepare_seconds": meta["prepare_seconds"],
           "vocab_size": data.vocab_size, "n_docs": meta["n_docs"], "n_train_tokens": data.n_train_tokens,
           "n_val_tokens": data.n_val_tokens, "unigram_entropy": round(data.unigram_entropy, 3),
           "sources_bytes": sum(p.stat().st_size for p in root.iterdir()),
           "prepared_bytes": sum(p.stat().st_size for p in data.dir.iterdir()),
           "sources": {s.name: {**manifest["sources"][s.name], "text": s.text, **meta["per_source"].get(s.name, {})}
                       for s in SOURCES}}
    written.write_outputs(out.parent, {out.name: json.dumps(doc, indent=1, ensure_ascii=False) + "\n"}, by=BY,
                          adopt=overwrite)
    log(f"registry: wrote {out}")
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m smallinit.data.registry_record",
                                     description=f"Measure data=registry at its defaults into {OUT}.")
    parser.add_argument("--cache-dir", default=os.environ.get("SMALLINIT_CACHE") or "~/.cache/smallinit")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an --out file no smallinit command wrote, or one edited since")
    args = parser.parse_args(argv)
    try:
        measure(args.cache_dir, args.out, overwrite=args.overwrite)
    except (FetchError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
