"""data_prep: tokenising the default corpus (bundled bilingual text, 4k byte-level BPE) into an
empty cache (cold), then the cache hit every later trial gets (warm). --tiny prepares the
corpus's first documents as a text corpus instead (settings.data_docs)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from .base.common import median, progress, spread


def _config(root: str, n_docs: int | None):
    from smallinit.data import corpus
    from smallinit.data.config import BilingualData, TextData

    if n_docs is None:
        return BilingualData(cache_dir=root)
    docs = corpus.read_bilingual()[:n_docs]
    path = Path(root) / "bundled_head.txt"
    path.write_text("\n\n".join(d.text.strip("\n") for d in docs) + "\n", encoding="utf-8")
    return TextData(paths=(str(path),), cache_dir=str(Path(root) / "cache"))


def run(settings) -> dict:
    from smallinit.data.pipeline import prepare

    cold, warm = [], []
    for r in range(settings.data_cold_repeats):
        root = tempfile.mkdtemp(prefix="smallinit-bench-cache-")
        try:
            cfg = _config(root, settings.data_docs)
            t0 = time.perf_counter()
            data = prepare(cfg, log=lambda *_: None)
            cold.append(time.perf_counter() - t0)
            progress("data_prep", f"cold {r + 1}/{settings.data_cold_repeats}: {cold[-1]:.2f} s "
                                  f"({data.n_train_tokens + data.n_val_tokens:,} tokens)")
            for _ in range(settings.data_warm_repeats if r == 0 else 0):
                t0 = time.perf_counter()
                prepare(cfg, log=lambda *_: None)
                warm.append(time.perf_counter() - t0)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    progress("data_prep", f"warm (median of {len(warm)}): {median(warm) * 1000:.1f} ms")
    return {
        "cold_s": median(cold),
        "warm_s": median(warm),
        "speedup": median(cold) / median(warm),
        "target": None,
        "pass": None,
        "metric": "seconds for prepare(BilingualData()) into an empty cache (cold) and again (warm, a cache hit)"
                  + ("" if settings.data_docs is None else f"; here the corpus's first {settings.data_docs} documents as data=text"),
        "corpus": {"name": cfg.corpus, "vocab_size": cfg.vocab_size, "train_tokens": data.n_train_tokens,
                   "val_tokens": data.n_val_tokens},
        "cold_runs": cold,
        "warm_runs": warm,
        "spread": {"cold": spread(cold), "warm": spread(warm)},
        "repeats": len(cold),
    }
