"""Token files: flat nanoGPT arrays and llm.c's headered shards, read as one stream, checked
before anything trains (data/shards.py, TokensData, prepare)."""

from __future__ import annotations

import numpy as np
import pytest

from smallinit.core.errors import ConfigError
from smallinit.data import shards
from smallinit.data.config import TokensData
from smallinit.data.pipeline import TrainBatches, prepare, val_batches


def _tokens(n: int, start: int = 0, vocab: int = 500) -> np.ndarray:
    return ((np.arange(start, start + n) * 7) % vocab).astype(np.uint16)


def _cfg(tmp_path, *paths, **kw) -> TokensData:
    return TokensData(paths=tuple(str(p) for p in paths), vocab_size=kw.pop("vocab_size", 500),
                      cache_dir=str(tmp_path / "cache"), **kw)


def test_headered_shard_round_trips_and_is_told_from_a_flat_file(tmp_path):
    arr = _tokens(3000)
    shards.write_shard(tmp_path / "h.bin", arr)
    arr.tofile(tmp_path / "f.bin")
    assert (tmp_path / "h.bin").stat().st_size == 1024 + 2 * 3000
    head, flat = shards.inspect(tmp_path / "h.bin", "uint16"), shards.inspect(tmp_path / "f.bin", "uint16")
    assert (head.offset, len(head), flat.offset, len(flat)) == (1024, 3000, 0, 3000)
    assert np.array_equal(shards.memmap(head, "uint16"), arr)
    assert np.array_equal(shards.memmap(flat, "uint16"), arr)


@pytest.mark.parametrize("corrupt, message", [
    (lambda h, t: (h.__setitem__(1, 2), h, t), "has shard version 2: only version 1"),
    (lambda h, t: (h.__setitem__(2, 2999), h, t), "declares 2999 tokens in its header but holds 3000"),
    (lambda h, t: (None, h, t[:-10]), "declares 3000 tokens in its header but holds 2990"),
    (lambda h, t: (None, h[:100], t[:0]), "truncated shard"),
])
def test_a_corrupt_header_is_one_line_naming_the_file(tmp_path, corrupt, message):
    header = np.zeros(256, dtype="<i4")
    header[:3] = shards.MAGIC, shards.VERSION, 3000
    _, header, toks = corrupt(header, _tokens(3000))
    path = tmp_path / "fineweb_train_000001.bin"
    path.write_bytes(header.tobytes() + toks.tobytes())
    with pytest.raises(ConfigError, match=message) as e:
        _cfg(tmp_path, tmp_path)  # a folder: the config itself reads every header
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_folder_of_shards_is_one_stream_with_named_validation(tmp_path):
    a, b, v = _tokens(1000), _tokens(1500, 1000), _tokens(400, 7)
    shards.write_shard(tmp_path / "fineweb_train_000001.bin", a)
    b.tofile(tmp_path / "fineweb_train_000002.bin")  # the formats may mix
    shards.write_shard(tmp_path / "fineweb_val_000000.bin", v)
    data = prepare(_cfg(tmp_path, tmp_path), log=lambda _: None)
    train = data.train_tokens()
    assert len(train) == data.n_train_tokens == 2500 and data.n_val_tokens == 400
    assert np.array_equal(np.asarray(train), np.concatenate([a, b]))
    assert np.array_equal(data.val_tokens(), v)
    # Windows across the shard boundary gather from both files.
    idx = np.array([[998, 999, 1000, 1001], [0, 1, 2499, 2498]])
    assert np.array_equal(train[idx], np.concatenate([a, b])[idx])
    batches = TrainBatches(train, batch_size=8, seq_len=16, seed=3)
    x, y = batches.batch(5)
    whole = np.concatenate([a, b])
    for row, s in zip(x.numpy(), batches.starts(5)):
        assert np.array_equal(row, whole[s:s + 16])
    assert len(val_batches(data.val_tokens(), 4, 16, 256)) == 4
    # A glob and an explicit val_paths say the same thing.
    same = prepare(_cfg(tmp_path, tmp_path / "*train*.bin", val_paths=(str(tmp_path / "fineweb_val_*.bin"),)),
                   log=lambda _: None)
    assert (same.n_train_tokens, same.n_val_tokens) == (2500, 400)


def test_without_validation_files_the_tail_of_the_stream_is_held_out(tmp_path):
    a, b = _tokens(1000), _tokens(1000, 1000)
    shards.write_shard(tmp_path / "s0.bin", a)
    shards.write_shard(tmp_path / "s1.bin", b)
    data = prepare(_cfg(tmp_path, tmp_path / "s*.bin", val_fraction=0.3), log=lambda _: None)
    whole = np.concatenate([a, b])
    assert np.array_equal(np.asarray(data.train_tokens()), whole[:1400])
    assert np.array_equal(np.asarray(data.val_tokens()), whole[1400:])


def test_token_ids_and_dtype_are_checked_against_the_vocabulary(tmp_path):
    arr = _tokens(2000)
    arr[1234] = 700
    shards.write_shard(tmp_path / "big.bin", arr)
    with pytest.raises(ConfigError, match=r"data.vocab_size=500 is invalid: .*big.bin holds id 700"):
        prepare(_cfg(tmp_path, tmp_path / "big.bin"), log=lambda _: None)
    # uint32 ids read as uint16: every second token 0.
    _tokens(2000).astype(np.uint32).tofile(tmp_path / "wide.bin")
    with pytest.raises(ConfigError, match=r"data.dtype='uint16' is invalid: every second token of .*wide.bin"):
        prepare(_cfg(tmp_path, tmp_path / "wide.bin"), log=lambda _: None)
    # A headered shard holds uint16 whatever data.dtype says.
    (tmp_path / "h").mkdir()
    shards.write_shard(tmp_path / "h" / "x.bin", _tokens(10))
    with pytest.raises(ConfigError, match="data.dtype='uint32' is invalid: .*headered shard of uint16"):
        _cfg(tmp_path, tmp_path / "h", dtype="uint32")


def test_a_header_with_another_magic_is_named_not_read_as_tokens(tmp_path):
    path = tmp_path / "train_000.bin"
    header = np.zeros(shards.HEADER_INTS, dtype="<i4")
    header[:3] = 20240801, 7, 1000  # llm.c's llama-3 shards: another magic, uint32 tokens
    path.write_bytes(header.tobytes() + np.arange(1000, dtype="<u4").tobytes())
    with pytest.raises(ConfigError, match="shard header with magic 20240801"):
        shards.inspect(path, "uint16")
    flat = tmp_path / "flat.bin"  # a flat file is still read as tokens
    flat.write_bytes(np.arange(5000, dtype="<u2").tobytes())
    assert shards.inspect(flat, "uint16").stop == 5000
