"""Raw text -> headered uint16 shards that `data=tokens data.paths=OUT_DIR` reads.

    python -m smallinit.data.make_shards TEXT_DIR OUT_DIR [--tokenizer tokenizer.json] [--vocab-size 32768]
                                  [--shard-tokens 100000000] [--val-fraction 0.01]

TEXT_DIR holds .txt (documents split at blank lines), .jsonl and .parquet files (a `text`
field or column), read recursively in sorted order. Without --tokenizer a byte-level BPE of
--vocab-size is trained on the first --tokenizer-docs documents, the same recipe the project
uses for data=text (data/pipeline.py); with it, any `tokenizers` JSON is used as it is.

OUT_DIR (new or empty; --overwrite replaces an earlier run's shards there, nothing else) gets
`train_000000.bin, ...` and `val_000000.bin` in llm.c's headered format (what
data/shards.py reads; the `val` in the name makes them validation), `tokenizer.json` and
`shards.json` (counts, vocabulary, sources, and the tokenizer's sha256, so that
`python -m smallinit.trainer.export` ships a trial of these shards with the tokenizer that made them). Every k-th document (k = 1/val_fraction, the
first included) goes to validation, so both sides draw from every file. Each document ends
with <|endoftext|> when the tokenizer has it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from smallinit.model.config import GPU_VOCAB

from .corpus import EOT, TEXT_SUFFIXES, iter_text_file
from .shards import SHARDS_META, TOKENIZER_FILE, file_sha256, write_shard

SUFFIXES = TEXT_SUFFIXES
MAX_VOCAB = 2**16  # the headered format stores uint16 tokens


def find_files(text_dir: Path) -> list[Path]:
    return sorted(p for p in text_dir.rglob("*") if p.is_file() and p.suffix in SUFFIXES)


def documents(files: list[Path]) -> Iterator[str]:
    """Each document's text, read by the reader data=text uses (corpus.iter_text_file)."""
    for path in files:
        yield from (d.text for d in iter_text_file(path))


def load_tokenizer(path: Path | None, files: list[Path], vocab_size: int, n_docs: int):
    if path is not None:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path))
    from .pipeline import train_tokenizer

    texts = []
    for text in documents(files):
        texts.append(text)
        if len(texts) >= n_docs:
            break
    return train_tokenizer(texts, vocab_size)


class ShardWriter:
    """Buffers one side's tokens and writes a shard every `shard_tokens` tokens."""

    def __init__(self, out_dir: Path, side: str, shard_tokens: int):
        self.out_dir, self.side, self.shard_tokens = out_dir, side, shard_tokens
        self.buffer: list[np.ndarray] = []
        self.buffered = self.total = 0
        self.paths: list[Path] = []

    def add(self, ids: np.ndarray) -> None:
        self.buffer.append(ids)
        self.buffered += len(ids)
        while self.buffered >= self.shard_tokens:
            self._write(self.shard_tokens)

    def close(self) -> None:
        if self.buffered:
            self._write(self.buffered)

    def _write(self, n: int) -> None:
        flat = np.concatenate(self.buffer)
        path = self.out_dir / f"{self.side}_{len(self.paths):06d}.bin"
        write_shard(path, flat[:n])
        self.paths.append(path)
        self.buffer, self.buffered, self.total = [flat[n:]], len(flat) - n, self.total + n


def make_shards(text_dir: Path, out_dir: Path, tokenizer: Path | None = None, vocab_size: int = GPU_VOCAB,
                shard_tokens: int = 100_000_000, val_fraction: float = 0.01, tokenizer_docs: int = 200_000,
                batch_docs: int = 1024, log=print, overwrite: bool = False) -> dict:
    files = find_files(text_dir)
    if not files:
        raise ValueError(f"{text_dir} has no {'/'.join(SUFFIXES)} files")
    if not 0 < val_fraction <= 0.5:
        raise ValueError(f"--val-fraction={val_fraction}: must be in (0, 0.5]")
    earlier = earlier_output(out_dir, overwrite)  # before the tokenizer is trained: a refusal costs nothing
    tok = load_tokenizer(tokenizer, files, vocab_size, tokenizer_docs)
    vocab = tok.get_vocab_size()
    if vocab > MAX_VOCAB:
        raise ValueError(f"the tokenizer has {vocab} tokens: headered shards hold ids < {MAX_VOCAB}")
    (out_dir / SHARDS_META).unlink(missing_ok=True)  # a run cut short below leaves no list: the folder is nobody's
    for name in earlier:
        (out_dir / name).unlink(missing_ok=True)  # the earlier shards go: a stale one never sits beside the new
    out_dir.mkdir(parents=True, exist_ok=True)
    eot = tok.token_to_id(EOT)
    every = max(2, round(1 / val_fraction))
    writers = {side: ShardWriter(out_dir, side, shard_tokens) for side in ("train", "val")}
    n_docs, batch = 0, []

    def flush() -> None:
        for (i, _), enc in zip(batch, tok.encode_batch([t for _, t in batch], add_special_tokens=False)):
            ids = enc.ids + ([eot] if eot is not None else [])
            writers["val" if i % every == 0 else "train"].add(np.asarray(ids, dtype=np.uint16))
        batch.clear()

    try:
        for text in documents(files):
            batch.append((n_docs, text))
            n_docs += 1
            if len(batch) >= batch_docs:
                flush()
        flush()
        for w in writers.values():
            w.close()
        if not writers["train"].total or not writers["val"].total:
            raise ValueError(f"{text_dir}: {n_docs} document(s), too few for both a train and a val side "
                             f"(every {every}th goes to val)")
    except BaseException:  # a failed or interrupted run takes its shards with it (the earlier run's went
        for path in out_dir.iterdir():  # before it began): the folder holds nothing of it
            if SHARD_NAME.fullmatch(path.name):
                path.unlink(missing_ok=True)
        raise
    tok.save(str(out_dir / TOKENIZER_FILE))
    meta = {"vocab_size": vocab, "eot_id": eot, "documents": n_docs, "val_every": every,
            "train_tokens": writers["train"].total, "val_tokens": writers["val"].total,
            "train_shards": [p.name for p in writers["train"].paths], "val_shards": [p.name for p in writers["val"].paths],
            "tokenizer": str(tokenizer) if tokenizer else f"byte-level BPE trained here (vocab_size={vocab_size})",
            # what trainer.export ships with a data=tokens trial of these shards (shards.recorded_tokenizer)
            "tokenizer_file": TOKENIZER_FILE, "tokenizer_sha256": file_sha256(out_dir / TOKENIZER_FILE),
            "sources": [str(f) for f in files]}
    (out_dir / SHARDS_META).write_text(json.dumps(meta, indent=1))
    log(f"{n_docs:,} documents -> {meta['train_tokens']:,} train tokens in {len(meta['train_shards'])} shard(s), "
        f"{meta['val_tokens']:,} val tokens in {len(meta['val_shards'])}, vocab {vocab}, in {out_dir}\n"
        f"train on them: python sweep.py -m +experiment=gpu/gamma_scan data=tokens data.paths={out_dir} "
        f"data.vocab_size={max(vocab, 2)}")
    return meta


SHARD_NAME = re.compile(r"(train|val)_\d{6}\.bin")  # ShardWriter's names


def earlier_output(out_dir: Path, overwrite: bool) -> list[str]:
    """The files of an earlier make_shards run in out_dir (those its shards.json lists, and it)
    that this run replaces; [] for a new or empty folder. A folder holding any other file is
    refused, and an earlier output without `overwrite` (ValueError, before anything is written)."""
    present = sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file()) \
        if out_dir.is_dir() else []
    if not present:
        return []
    try:
        meta = json.loads((out_dir / SHARDS_META).read_text())
        listed = {SHARDS_META, meta["tokenizer_file"], *meta["train_shards"], *meta["val_shards"]}
    except (OSError, ValueError, KeyError, TypeError):
        # No list: a run killed before it wrote one leaves shards and a tokenizer named as ours.
        listed = {n for n in present if n == TOKENIZER_FILE or SHARD_NAME.fullmatch(n)}
    foreign = [n for n in present if n not in listed]
    if foreign:
        shown = ", ".join(foreign[:4]) + (" ..." if len(foreign) > 4 else "")
        raise ValueError(f"OUT_DIR={out_dir} holds files make_shards did not write ({shown}): give a new or empty "
                         "folder (nothing was written)")
    if not overwrite:
        what = "shards made earlier" if SHARDS_META in present else "shards of an earlier run that did not finish"
        raise ValueError(f"OUT_DIR={out_dir} holds {what}: give another folder, or --overwrite to replace them "
                         "(nothing was written)")
    return present


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m smallinit.data.make_shards", description=__doc__.split("\n\n")[0])
    p.add_argument("text_dir", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--tokenizer", type=Path, help="a tokenizers JSON; default: train a byte-level BPE here")
    p.add_argument("--vocab-size", type=int, default=GPU_VOCAB, help="of the BPE trained without --tokenizer")
    p.add_argument("--tokenizer-docs", type=int, default=200_000, help="documents the BPE is trained on")
    p.add_argument("--shard-tokens", type=int, default=100_000_000)
    p.add_argument("--val-fraction", type=float, default=0.01)
    p.add_argument("--overwrite", action="store_true", help="replace the shards an earlier run made in OUT_DIR")
    a = p.parse_args(argv)
    try:
        make_shards(a.text_dir, a.out_dir, a.tokenizer, a.vocab_size, a.shard_tokens, a.val_fraction, a.tokenizer_docs,
                    overwrite=a.overwrite)
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
