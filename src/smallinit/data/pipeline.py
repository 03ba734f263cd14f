"""Token data for training: tokenise once into a content-addressed cache, then sample windows.

    cfg = BilingualData()                    # bundled English + Chinese corpus, 4k BPE
    data = prepare(cfg)                      # cold: ~15 s; then a cache hit in milliseconds
    batches = TrainBatches(data.train_tokens(), batch_size=16, seq_len=256, seed=0)
    x, y = batches.batch(step)               # (B, T) int64, a pure function of (seed, step)
    val = val_batches(data.val_tokens(), 16, 256, max_tokens=2**18)

Cache layout, `cache_dir/<corpus>-<hash>/` where the hash covers the input files' contents
and every setting that changes the output (vocab_size, val_fraction, split_seed, FORMAT, and
data=registry's train_fraction):

    tokenizer.json   byte-level BPE trained on the train documents only
    train.bin        uint16 (uint32 if vocab > 65536) token ids, each document followed by
    val.bin          <|endoftext|>, documents in the seeded shuffle order (so any prefix of
                     val mixes the sources)
    split.npz        train_ids, val_ids: document indices (after dedupe) in file order;
                     with train_fraction < 1, train_ids is the leading share that train.bin holds
    meta.json        counts, dtype, unigram baselines, sources, and each file's size and sha256

The directory is built under a temporary name and renamed into place, so a reader sees all
of it or none of it; when two processes race, the loser discards its copy. A hit checks the
files against meta.json first (cache_damage); a damaged cache is set aside, named in one
line, and prepared again.

For corpus "tokens" (flat nanoGPT binaries or headered shards, data/shards.py) nothing is
copied: the cache holds meta.json only (with every shard's header checked and its largest
token id) and PreparedData points at ranges of the user's files.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from smallinit.core.errors import ConfigError, require

if TYPE_CHECKING:
    import torch

from . import corpus as corpus_mod
from . import registry_corpus, shards
from .config import CorpusData
from .corpus import EOT, Document
from .shards import Part

FORMAT = 1  # bump when the bytes written here change
TOKENS_FORMAT = 2  # corpus "tokens": bump when its meta.json changes (2: shards as parts)
SAMPLE_TOKENS = 1 << 24  # token statistics on huge binaries use an evenly strided sample


@dataclass(frozen=True)
class PreparedData:
    dir: Path
    tokenizer_path: Path | None  # None for corpus "tokens"
    train_path: Path  # the first file of each side
    val_path: Path
    dtype: str
    vocab_size: int  # the tokenizer's actual size, <= CorpusData.vocab_size
    n_train_tokens: int
    n_val_tokens: int
    unigram_entropy: float  # nats: entropy of the val tokens' own unigram distribution
    val_loss_train_unigram: float  # nats: val cross-entropy under add-one train unigram
    eot_id: int | None
    train_parts: tuple[Part, ...]  # token ranges of files, concatenated in order
    val_parts: tuple[Part, ...]
    meta: dict = field(repr=False, compare=False)

    def train_tokens(self) -> np.ndarray | shards.TokenStream:
        return shards.open_parts(list(self.train_parts), self.dtype)

    def val_tokens(self) -> np.ndarray | shards.TokenStream:
        return shards.open_parts(list(self.val_parts), self.dtype)

    def tokenizer(self):
        if self.tokenizer_path is None:
            raise ValueError(f"corpus {self.meta['corpus']!r} has no tokenizer")
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.tokenizer_path))


def _locate(cfg: CorpusData) -> tuple[Path, dict, list[Path], list[dict]]:
    files = list(corpus_mod.bundled_files().values()) if cfg.corpus == "bilingual" else cfg.files()
    digest, sources = corpus_mod.fingerprint(files) if cfg.corpus != "tokens" else _stat_fp(files)
    settings = {"format": FORMAT, "corpus": cfg.corpus, "vocab_size": cfg.vocab_size,
                "val_fraction": cfg.val_fraction, "split_seed": cfg.split_seed,
                "input_dtype": cfg.dtype if cfg.corpus == "tokens" else None, "inputs": digest}
    if hasattr(cfg, "train_fraction"):  # data=registry's alone: the other kinds' keys stay as they were
        settings["train_fraction"] = cfg.train_fraction
    if cfg.corpus == "tokens":  # the file roles and the reader are part of what the cache holds
        train, val = cfg.roles()
        settings.update(tokens_format=TOKENS_FORMAT, train_files=[str(f.resolve()) for f in train],
                        val_files=[str(f.resolve()) for f in val])
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return cfg.cache_path / f"{cfg.corpus}-{key}", settings, files, sources


def cache_path_for(cfg: CorpusData) -> Path:
    """The directory prepare(cfg) uses: a hash of the input files and the settings."""
    return _locate(cfg)[0]


def prepare(cfg: CorpusData, log=print) -> PreparedData:
    """Return the prepared data for cfg, building it into the cache on first use."""
    t0 = time.perf_counter()
    final, settings, files, sources = _locate(cfg)
    if (final / "meta.json").is_file():
        damage = cache_damage(final)
        if damage is None:
            data = _load(final)
            log(f"data: cache hit {final} ({data.n_train_tokens:,} train / {data.n_val_tokens:,} "
                f"val tokens, vocab {data.vocab_size}) in {time.perf_counter() - t0:.2f} s")
            return data
        aside = final.with_name(f"{final.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        try:
            os.rename(final, aside)
            log(f"data: the cache {final} is damaged ({damage}): set aside as {aside.name}, preparing it again")
        except FileNotFoundError:  # another trial set it aside first
            pass

    log(f"data: preparing {final} from {len(files)} file(s) ...")
    cfg.cache_path.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=cfg.cache_path))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared
    try:
        meta = {**settings, "sources": sources}
        if cfg.corpus == "tokens":
            meta.update(_build_tokens(cfg, files))
        else:
            meta.update(_build_text(cfg, tmp))
        meta["prepare_seconds"] = round(time.perf_counter() - t0, 2)
        if cfg.corpus != "tokens":  # what a cache hit checks (cache_damage)
            meta["files"] = {p.name: {"bytes": p.stat().st_size, "sha256": shards.file_sha256(p)}
                             for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False))
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "meta.json").is_file():
                raise
            shutil.rmtree(tmp)  # a concurrent process finished first; use its copy
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    data = _load(final)
    log(f"data: prepared {final} ({meta.get('n_docs', '-')} docs -> {data.n_train_tokens:,} "
        f"train / {data.n_val_tokens:,} val tokens, vocab {data.vocab_size}) in "
        f"{time.perf_counter() - t0:.1f} s")
    return data


def still_usable(data: PreparedData) -> str | None:
    """Why a corpus prepared elsewhere (by the sweep's driver) cannot be used here as it is, or
    None: its cache folder must be on this machine and whole. A worker given one that is not
    prepares the corpus itself."""
    if not (data.dir / "meta.json").is_file():
        return f"{data.dir} is not on this machine"
    return cache_damage(data.dir)


# Cache files up to this size are checked against their sha256 on every hit (the default
# corpus's take ~20 ms); larger ones against their size only, so a hit stays fast.
HASH_CHECK_BYTES = 64 * 2**20


def cache_damage(d: Path) -> str | None:
    """Why the prepared cache d cannot be used as it is (a file missing, cut short or changed
    since it was written), or None. Caches written before files were recorded are checked
    against the token counts their meta.json holds."""
    try:
        meta = json.loads((d / "meta.json").read_text())
        if meta["corpus"] == "tokens":  # the user's shards, fingerprinted in the cache key
            return None
        itemsize = np.dtype(meta["dtype"]).itemsize
        expected = {f"{side}.bin": {"bytes": meta[f"{side}_slice"][1] * itemsize} for side in ("train", "val")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"meta.json is unreadable: {type(e).__name__}"
    expected.update(meta.get("files", {}))
    for name, want in expected.items():
        path = d / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want["bytes"]:
            return f"{name} holds {size:,} bytes, {want['bytes']:,} were written"
        if "sha256" in want and size <= HASH_CHECK_BYTES and shards.file_sha256(path) != want["sha256"]:
            return f"{name} changed since it was written (sha256)"
    return None


def _load(d: Path) -> PreparedData:
    meta = json.loads((d / "meta.json").read_text())
    tokens = meta["corpus"] == "tokens"
    if tokens:
        train_parts = tuple(Part(*p) for p in meta["train_parts"])
        val_parts = tuple(Part(*p) for p in meta["val_parts"])
    else:  # the cache's own train.bin / val.bin, wherever the cache folder now is
        train_parts = (Part(str(d / "train.bin"), 0, *meta["train_slice"]),)
        val_parts = (Part(str(d / "val.bin"), 0, *meta["val_slice"]),)
    return PreparedData(
        dir=d,
        tokenizer_path=None if tokens else d / "tokenizer.json",
        train_path=Path(train_parts[0].path) if tokens else d / "train.bin",
        val_path=Path(val_parts[0].path) if tokens else d / "val.bin",
        dtype=meta["dtype"],
        vocab_size=meta["tokenizer_vocab_size"],
        n_train_tokens=meta["n_train_tokens"],
        n_val_tokens=meta["n_val_tokens"],
        unigram_entropy=meta["unigram_entropy"],
        val_loss_train_unigram=meta["val_loss_train_unigram"],
        eot_id=meta["eot_id"],
        train_parts=train_parts,
        val_parts=val_parts,
        meta=meta,
    )


def split_documents(docs: list[Document], val_fraction: float, seed: int):
    """(train_ids, val_ids) in shuffled order; each source gives round(f * n) docs to val.

    Stratified by source so the bilingual val set keeps the corpus's language mix; every
    source with >= 2 documents gives at least one to each side.
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    perm = rng.permutation(len(docs))
    sources = np.array([docs[i].source for i in perm])
    val_mask = np.zeros(len(docs), dtype=bool)
    for s in dict.fromkeys(sources):
        where = np.flatnonzero(sources == s)
        n_val = min(max(round(val_fraction * len(where)), 1), len(where) - 1)
        val_mask[where[:n_val]] = True
    return perm[~val_mask], perm[val_mask]


def train_tokenizer(texts, vocab_size: int):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def _build_text(cfg: CorpusData, out: Path) -> dict:
    try:
        if cfg.corpus == "bilingual":
            docs = corpus_mod.read_bilingual()
        elif cfg.corpus == "registry":
            docs = registry_corpus.read_registry(cfg.files())
        else:
            docs = corpus_mod.read_text_files(cfg.files())
    except ValueError as e:  # a file that is not UTF-8 text or not JSON lines, named
        raise ConfigError(f"data.paths={list(cfg.paths)!r} is invalid: {e}") from None
    if len(docs) < 2:
        raise ConfigError(f"data.paths={cfg.paths!r} is invalid: {len(docs)} document(s), "
                          "need >= 2 to split train/val")
    train_ids, val_ids = split_documents(docs, cfg.val_fraction, cfg.split_seed)
    tok = train_tokenizer([docs[i].text for i in train_ids], cfg.vocab_size)
    fraction = getattr(cfg, "train_fraction", 1.0)
    if fraction < 1:  # after the tokenizer, which stays the whole training set's
        train_ids = train_ids[:max(1, round(fraction * len(train_ids)))]
    vocab, eot = tok.get_vocab_size(), tok.token_to_id(EOT)
    dtype = "uint16" if vocab <= 2**16 else "uint32"
    meta: dict = {"n_docs": len(docs), "n_train_docs": len(train_ids),
                  "n_val_docs": len(val_ids), "per_source": {}}
    arrays = {}
    for side, ids in (("train", train_ids), ("val", val_ids)):
        arr, lengths = _encode(tok, [docs[i].text for i in ids], eot, dtype)
        arr.tofile(out / f"{side}.bin")
        arrays[side] = arr
        for i, n in zip(ids, lengths):
            s = meta["per_source"].setdefault(docs[i].source, {})
            for k, v in ((f"{side}_docs", 1), (f"{side}_chars", len(docs[i].text)),
                         (f"{side}_tokens", int(n))):
                s[k] = s.get(k, 0) + v
    tok.save(str(out / "tokenizer.json"))
    np.savez(out / "split.npz", train_ids=train_ids, val_ids=val_ids)
    return {**meta, **_token_stats(arrays["train"], arrays["val"], vocab), "dtype": dtype,
            "tokenizer_vocab_size": vocab, "eot_id": eot,
            "train_slice": [0, len(arrays["train"])], "val_slice": [0, len(arrays["val"])]}


def _encode(tok, texts: list[str], eot: int, dtype: str, batch: int = 4096) -> tuple[np.ndarray, list[int]]:
    """(each text's ids followed by eot, concatenated; each text's length with its eot). A batch
    at a time: the tokenizer's Encoding objects cost ~70 bytes a token, 3 GB for 50M at once."""
    parts, lengths = [], []
    for start in range(0, len(texts), batch):
        encoded = tok.encode_batch_fast(texts[start:start + batch], add_special_tokens=False)
        ids = [e.ids + [eot] for e in encoded]
        lengths += [len(x) for x in ids]
        parts.append(np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=sum(map(len, ids))))
    return (np.concatenate(parts) if parts else np.empty(0, dtype=dtype)), lengths


def _stat_fp(files: list[Path]) -> tuple[str, list[dict]]:
    records = [{"path": str(f.resolve()), "bytes": f.stat().st_size,
                "mtime_ns": f.stat().st_mtime_ns} for f in files]
    return hashlib.sha256(json.dumps(records).encode()).hexdigest(), records


def _build_tokens(cfg: CorpusData, files: list[Path]) -> dict:
    """Check every file (header, size, dtype, token ids against data.vocab_size) and record
    which token ranges train and which validate. Reads each file once, in chunks."""
    train_files, val_files = cfg.roles()
    train = [shards.inspect(f, cfg.dtype) for f in train_files]
    if val_files:
        val = [shards.inspect(f, cfg.dtype) for f in val_files]
    else:  # held out: the tail of the concatenated training tokens (one file: nanoGPT's cut)
        n = sum(len(p) for p in train)
        train, val = shards.split_tail(train, max(1, math.ceil(cfg.val_fraction * n)))
    if not train or not val:
        raise ConfigError(f"data.paths={list(cfg.paths)!r} is invalid: {sum(len(p) for p in train + val)} "
                          "token(s), too few to hold out validation tokens")
    for part in train + val:
        arr = shards.memmap(part, cfg.dtype)
        if cfg.dtype == "uint16" and shards.looks_like_uint32(arr):
            raise ConfigError(f"data.dtype='uint16' is invalid: every second token of {part.path} is 0, "
                              "as when uint32 ids are read as uint16 (set data.dtype=uint32)")
        top = shards.max_token(arr)
        require(top < cfg.vocab_size, "data.vocab_size", cfg.vocab_size,
                f"> every token id, but {part.path} holds id {top} (declare the tokenizer's vocabulary, "
                "or check data.dtype)")
    train_arr, val_arr = shards.open_parts(train, cfg.dtype), shards.open_parts(val, cfg.dtype)
    return {**_token_stats(train_arr, val_arr, cfg.vocab_size), "dtype": cfg.dtype,
            "tokenizer_vocab_size": cfg.vocab_size, "eot_id": None,
            "train_parts": [p.to_list() for p in train], "val_parts": [p.to_list() for p in val]}


def _sample(arr: np.ndarray, n: int = SAMPLE_TOKENS, chunk: int = 1 << 16) -> np.ndarray:
    """arr itself if short, else n tokens in evenly spaced contiguous chunks."""
    if len(arr) <= n:
        return np.asarray(arr)
    starts = np.linspace(0, len(arr) - chunk, n // chunk).astype(np.int64)
    return np.concatenate([arr[s:s + chunk] for s in starts])


def unigram_entropy(tokens: np.ndarray) -> float:
    """Entropy in nats of the tokens' empirical unigram distribution."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def unigram_cross_entropy(tokens: np.ndarray, reference: np.ndarray, vocab_size: int) -> float:
    """Mean -log q(token) in nats, q the add-one smoothed unigram of `reference`."""
    q = np.bincount(np.asarray(reference, dtype=np.int64), minlength=vocab_size) + 1.0
    q /= q.sum()
    counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size)
    return float(-(counts * np.log(q)).sum() / counts.sum())


def _token_stats(train: np.ndarray, val: np.ndarray, vocab_size: int) -> dict:
    train_s, val_s = _sample(train), _sample(val)
    return {"n_train_tokens": len(train), "n_val_tokens": len(val),
            "unigram_entropy": unigram_entropy(val_s),
            "val_loss_train_unigram": unigram_cross_entropy(val_s, train_s, vocab_size),
            "stats_sampled": len(train_s) < len(train) or len(val_s) < len(val)}


class TrainBatches:
    """Random training windows, each batch a pure function of (seed, step).

    No iterator state: resuming at step k calls batch(k) and gets exactly the batch an
    uninterrupted run saw at step k. Windows start uniformly at random (with replacement)
    anywhere a full (seq_len + 1)-token window fits, crossing document boundaries as in
    nanoGPT.
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int):
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"batch_size={batch_size}, seq_len={seq_len}: both must be >= 1")
        if len(tokens) < seq_len + 1:
            raise ValueError(f"seq_len={seq_len} needs >= {seq_len + 1} tokens, have {len(tokens)}")
        self.tokens, self.batch_size, self.seq_len, self.seed = tokens, batch_size, seq_len, seed
        self._offsets = np.arange(seq_len + 1)

    def starts(self, step: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64([self.seed, step]))
        return rng.integers(0, len(self.tokens) - self.seq_len, size=self.batch_size)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        windows = self.tokens[self.starts(step)[:, None] + self._offsets]  # (B, T+1)
        import torch  # here, not at the top: the sweep driver prepares data without torch

        t = torch.from_numpy(windows.astype(np.int64))
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()  # (B, T), (B, T)


def val_batches(val_tokens: np.ndarray, batch_size: int, seq_len: int,
                max_tokens: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive non-overlapping windows from the start of val, the same for every trial.

    Window i predicts tokens [i*T + 1, (i+1)*T]; at most max_tokens // seq_len windows (all
    of val when None, none when 0); the last batch may be smaller than batch_size.
    """
    if max_tokens == 0:
        return []
    n_windows = (len(val_tokens) - 1) // seq_len
    if max_tokens is not None:
        n_windows = min(n_windows, max_tokens // seq_len)
    if n_windows < 1:
        raise ValueError(f"val has {len(val_tokens)} tokens, max_tokens={max_tokens}: "
                         f"not one window of seq_len={seq_len}")
    import torch

    arr = np.asarray(val_tokens[:n_windows * seq_len + 1], dtype=np.int64)
    x = torch.from_numpy(arr[:-1].reshape(n_windows, seq_len))
    y = torch.from_numpy(arr[1:].reshape(n_windows, seq_len))
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, n_windows, batch_size)]
