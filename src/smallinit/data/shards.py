"""Token files on disk: flat nanoGPT `.bin` arrays and llm.c's headered shards, read as one stream.

Two formats, told apart by the first four bytes:

    flat      the file is the token array (uint16 or uint32, data.dtype), as nanoGPT writes it
    headered  256 x int32 header [magic 20240520, version 1, token count, 0...], then `count`
              uint16 tokens: the FineWeb / FineWeb-Edu shards of llm.c and the modded-nanogpt
              speedrun (dev/data/data_common.py: write_datafile)

A flat uint16 file whose first two tokens happen to spell the magic (ids 55432 then 308) is
read as headered and then refused for its size or version, never silently misread.

A corpus is a list of `Part`s, [start, stop) token ranges of files, concatenated in order.
`open_parts` memory-maps them; a single part is a plain np.memmap (the fast path the
trainer always had), several are a `TokenStream` that gathers across shard boundaries.
Needs numpy only: the sweep driver reads headers without torch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smallinit.core.errors import ConfigError

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256
HEADER_BYTES = HEADER_INTS * 4
HEADERED_DTYPE = "uint16"
ITEM_BYTES = {"uint16": 2, "uint32": 4}
SHARDS_META, TOKENIZER_FILE = "shards.json", "tokenizer.json"  # what data/make_shards.py writes beside them


@dataclass(frozen=True)
class Part:
    path: str
    offset: int  # bytes before token 0 (the header)
    start: int  # [start, stop) in tokens of this file
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def to_list(self) -> list:
        return [self.path, self.offset, self.start, self.stop]


def inspect(path: Path, dtype: str) -> Part:
    """The whole file as a Part, after checking its header or its size. Reads 1 KiB at most."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = np.frombuffer(f.read(HEADER_BYTES), dtype="<i4") if size >= 4 else np.zeros(0, "<i4")
    if len(head) and head[0] == MAGIC:
        if len(head) < HEADER_INTS:
            raise ConfigError(f"data.paths: {path} is a truncated shard: {size} bytes, less than its "
                              f"{HEADER_BYTES}-byte header")
        if head[1] != VERSION:
            raise ConfigError(f"data.paths: {path} has shard version {head[1]}: only version {VERSION} "
                              f"(uint16 tokens, magic {MAGIC}) is readable")
        count, held = int(head[2]), (size - HEADER_BYTES) / 2
        if count <= 0 or size != HEADER_BYTES + 2 * count:
            raise ConfigError(f"data.paths: {path} declares {count} tokens in its header but holds "
                              f"{int(held) if held.is_integer() else held} (file truncated or header corrupt)")
        if dtype != HEADERED_DTYPE:
            raise ConfigError(f"data.dtype={dtype!r} is invalid: {path} is a headered shard of uint16 tokens")
        return Part(str(path.resolve()), HEADER_BYTES, 0, count)
    if len(head) == HEADER_INTS and 0 < head[1] < 100 and size - HEADER_BYTES in (2 * int(head[2]), 4 * int(head[2])):
        # A header whose count matches the file's size, with another magic: not flat tokens.
        raise ConfigError(f"data.paths: {path} has a shard header with magic {head[0]}: only magic {MAGIC} "
                          f"(version {VERSION}, uint16 tokens) or flat token files are readable")
    if size == 0 or size % ITEM_BYTES[dtype]:
        raise ConfigError(f"data.paths: {path} is not a non-empty array of {dtype} "
                          f"({size} bytes; set data.dtype to the file's element type)")
    return Part(str(path.resolve()), 0, 0, size // ITEM_BYTES[dtype])


def memmap(part: Part, dtype: str) -> np.memmap:
    return np.memmap(part.path, dtype=dtype, mode="r", offset=part.offset)[part.start:part.stop]


def split_tail(parts: list[Part], n_tail: int) -> tuple[list[Part], list[Part]]:
    """(head, tail) of the concatenated parts, the tail the last n_tail tokens."""
    cut = sum(len(p) for p in parts) - n_tail
    head, tail, seen = [], [], 0
    for p in parts:
        local = min(max(cut - seen, 0), len(p))
        if local > 0:
            head.append(Part(p.path, p.offset, p.start, p.start + local))
        if local < len(p):
            tail.append(Part(p.path, p.offset, p.start + local, p.stop))
        seen += len(p)
    return head, tail


def open_parts(parts: list[Part], dtype: str) -> np.ndarray | TokenStream:
    arrays = [memmap(p, dtype) for p in parts]
    return arrays[0] if len(arrays) == 1 else TokenStream(arrays)


class TokenStream:
    """Several memory-mapped arrays read as one: len(), slices and integer-array gathers (what
    TrainBatches, val_batches and the token statistics use). Nothing is read until indexed."""

    def __init__(self, arrays: list[np.ndarray]):
        self.arrays = arrays
        self.ends = np.cumsum([len(a) for a in arrays])  # token index where each array ends
        self.dtype = arrays[0].dtype

    def __len__(self) -> int:
        return int(self.ends[-1])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.concatenate(self.arrays)
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            return self._gather(np.arange(start, stop, step))
        return self._gather(np.asarray(index))

    def _gather(self, idx: np.ndarray) -> np.ndarray:
        """Tokens at idx (any shape), each looked up in the array that holds it."""
        which = np.searchsorted(self.ends, idx, side="right")
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"token index out of range [0, {len(self)})")
        out = np.empty(idx.shape, dtype=self.dtype)
        starts = np.concatenate([[0], self.ends[:-1]])
        for k in np.unique(which):
            mask = which == k
            out[mask] = self.arrays[k][idx[mask] - starts[k]]
        return out


def max_token(arr: np.ndarray, chunk: int = 1 << 26) -> int:
    """Largest id in a memory-mapped array, read in chunks so a 10 GB shard needs no 10 GB of RAM."""
    return max(int(arr[i:i + chunk].max()) for i in range(0, len(arr), chunk))


def looks_like_uint32(arr: np.ndarray, n: int = 1 << 16) -> bool:
    """uint32 ids below 65536 read as uint16 alternate id, 0, id, 0: every odd position zero."""
    head = np.asarray(arr[: min(len(arr), n) // 2 * 2])
    return len(head) >= 64 and not head[1::2].any() and head[0::2].any()


def write_shard(path: Path, tokens: np.ndarray) -> None:
    """Write tokens (ids < 65536) as a headered shard, the format `inspect` reads."""
    tokens = np.asarray(tokens)
    if len(tokens) and int(tokens.max()) >= 2**16:
        raise ValueError(f"headered shards hold uint16 tokens; id {int(tokens.max())} does not fit")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, VERSION, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def recorded_tokenizer(files: list[Path]) -> Path:
    """The tokenizer.json that data/make_shards.py made these shards with, read from the
    shards.json beside them; ValueError saying why when there is none, or not one for all."""
    found: dict[str, Path] = {}
    for folder in sorted({Path(f).resolve().parent for f in files}):
        meta_path = folder / SHARDS_META
        if not meta_path.is_file():
            raise ValueError(f"{folder} has no {SHARDS_META} (shards not made by python -m smallinit.data.make_shards)")
        meta = json.loads(meta_path.read_text())
        listed = set(meta.get("train_shards", [])) | set(meta.get("val_shards", []))
        strays = sorted(Path(f).name for f in files if Path(f).resolve().parent == folder and Path(f).name not in listed)
        if strays:
            raise ValueError(f"{meta_path} does not list {strays[:3]}: they were not made with its tokenizer")
        tok = folder / meta.get("tokenizer_file", TOKENIZER_FILE)
        if not tok.is_file():
            raise ValueError(f"{tok} does not exist")
        digest = file_sha256(tok)
        if meta.get("tokenizer_sha256", digest) != digest:  # shards.json before the digest was recorded: trusted
            raise ValueError(f"{tok} changed after make_shards wrote {meta_path} (sha256 differs)")
        found.setdefault(digest, tok)
    if len(found) != 1:
        raise ValueError(f"the shards come from {len(found)} different tokenizers: {sorted(map(str, found.values()))}")
    return next(iter(found.values()))
