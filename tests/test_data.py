"""The data layer: bundled corpus, tokenizer, split, cache, batches, and the other corpora."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import numpy as np
import pytest
import torch

from smallinit.data import corpus
from smallinit.data.config import BilingualData, TextData, TokensData, data_config_from_dict
from smallinit.data.pipeline import (
    TrainBatches,
    cache_damage,
    cache_path_for,
    prepare,
    unigram_cross_entropy,
    unigram_entropy,
    val_batches,
)
from smallinit.model.config import ConfigError


@pytest.fixture(scope="session")
def bilingual(tmp_path_factory):
    """The default corpus (KJV + People's Daily, 4k BPE) prepared once per test run."""
    cfg = BilingualData(cache_dir=str(tmp_path_factory.mktemp("cache")))
    t0 = time.perf_counter()
    data = prepare(cfg, log=lambda _: None)
    return cfg, data, time.perf_counter() - t0


@pytest.fixture(scope="session")
def bilingual_docs():
    return corpus.read_bilingual()


def test_bundled_corpus_shape(bilingual_docs):
    by_source = {}
    for d in bilingual_docs:
        by_source.setdefault(d.source, []).append(d)
    assert len(by_source["kjv"]) == 1189  # chapters of the KJV
    kjv_chars = sum(len(d.text) for d in by_source["kjv"])
    assert 4.0e6 < kjv_chars < 4.3e6
    pd = by_source["peoples_daily"]
    assert 18_000 < len(pd) < 19_484  # paragraph lines less exact duplicates
    assert not any("/" in d.text or "  " in d.text for d in pd[:2000])  # POS tags stripped
    assert pd[0].text.startswith("迈向充满希望的新世纪")
    assert len({d.text for d in bilingual_docs}) == len(bilingual_docs)


def test_round_trip_is_exact(bilingual, bilingual_docs):
    _, data, _ = bilingual
    tok = data.tokenizer()
    split = np.load(data.dir / "split.npz")
    val = [bilingual_docs[i] for i in split["val_ids"]]
    samples = [next(d.text for d in val if d.source == "kjv"),
               next(d.text for d in val if d.source == "peoples_daily"),
               "  leading spaces,\ttabs\r\nand CRLF\n\n\nblank lines ",
               "混合 mixed 中文and English！１９９８年，emoji 🙂 é ß ∑"]
    for s in samples:
        ids = tok.encode(s, add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == s
        assert data.eot_id not in ids
    # The BPE learned real merges: ~3.5 bytes per token on both languages.
    for s in samples[:2]:
        assert len(s.encode()) / len(tok.encode(s).ids) > 2.5


def test_split_by_document(bilingual, bilingual_docs):
    _, data, _ = bilingual
    split = np.load(data.dir / "split.npz")
    train, val = split["train_ids"], split["val_ids"]
    assert not set(train) & set(val)
    assert sorted(np.concatenate([train, val])) == list(range(len(bilingual_docs)))
    texts = lambda ids: {bilingual_docs[i].text for i in ids}  # noqa: E731
    assert not texts(train) & texts(val)
    for source, s in data.meta["per_source"].items():
        n = s["train_docs"] + s["val_docs"]
        assert s["val_docs"] == round(0.05 * n), source  # stratified, exact per source
        assert 0.03 < s["val_tokens"] / (s["train_tokens"] + s["val_tokens"]) < 0.07, source
    assert 0.04 < data.n_val_tokens / (data.n_train_tokens + data.n_val_tokens) < 0.06
    # val.bin is the val documents in split order, each followed by <|endoftext|>.
    tok = data.tokenizer()
    expected = []
    for i in val[:40]:
        expected += tok.encode(bilingual_docs[i].text, add_special_tokens=False).ids + [data.eot_id]
    assert np.array_equal(data.val_tokens()[: len(expected)], expected)
    assert int((data.val_tokens() == data.eot_id).sum()) == len(val)
    assert int((data.train_tokens() == data.eot_id).sum()) == len(train)


def test_meta_and_unigram_numbers(bilingual):
    _, data, _ = bilingual
    meta = json.loads((data.dir / "meta.json").read_text())
    assert data.vocab_size == meta["tokenizer_vocab_size"] == 4096
    assert data.dtype == "uint16"
    assert data.n_train_tokens == data.train_path.stat().st_size // 2 == len(data.train_tokens())
    assert data.n_val_tokens == data.val_path.stat().st_size // 2
    assert 2.0e6 < data.n_train_tokens + data.n_val_tokens < 3.5e6  # ~2.8M: docs/paper.md#corpus-size
    val = np.asarray(data.val_tokens())
    assert data.unigram_entropy == pytest.approx(unigram_entropy(val), rel=1e-12)
    assert 5.0 < data.unigram_entropy < math.log(4096)
    # Gibbs: no distribution beats val's own unigram on val.
    assert data.val_loss_train_unigram > data.unigram_entropy
    assert data.val_loss_train_unigram < data.unigram_entropy + 0.2
    assert max(int(data.train_tokens().max()), int(val.max())) < data.vocab_size


def test_second_prepare_is_a_cache_hit(bilingual):
    cfg, data, cold = bilingual
    before = {p.name: p.stat().st_mtime_ns for p in data.dir.iterdir()}
    messages = []
    t0 = time.perf_counter()
    again = prepare(cfg, log=messages.append)
    warm = time.perf_counter() - t0
    assert again.dir == data.dir and again == data
    assert {p.name: p.stat().st_mtime_ns for p in data.dir.iterdir()} == before
    assert warm < 1.0 and warm < cold / 10, (warm, cold)
    assert len(messages) == 1 and "cache hit" in messages[0]
    assert [p.name for p in cfg.cache_path.iterdir()] == [data.dir.name]  # no temp left over
    # Each setting that changes the output gets its own directory.
    assert cache_path_for(cfg) == data.dir
    others = [dataclasses.replace(cfg, **kw) for kw in
              ({"split_seed": 1}, {"vocab_size": 4095}, {"val_fraction": 0.1})]
    assert len({cache_path_for(c) for c in [cfg, *others]}) == 4


def test_unigram_entropy_by_hand():
    assert unigram_entropy(np.array([0, 0, 1, 1])) == pytest.approx(math.log(2))
    assert unigram_entropy(np.array([3, 3, 3, 7])) == pytest.approx(
        -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert unigram_entropy(np.arange(4, dtype=np.uint16)) == pytest.approx(math.log(4))
    assert unigram_entropy(np.array([5] * 9)) == 0.0
    # reference [0, 0, 1] over vocab 3, add-one: q = (3, 2, 1) / 6.
    got = unigram_cross_entropy(np.array([0, 1]), np.array([0, 0, 1]), vocab_size=3)
    assert got == pytest.approx(-(math.log(3 / 6) + math.log(2 / 6)) / 2)


def test_train_batches_are_a_function_of_seed_and_step():
    tokens = (np.arange(50_000) % 60_000).astype(np.uint16)  # token value = its position
    b = TrainBatches(tokens, batch_size=8, seq_len=32, seed=3)
    x, y = b.batch(5)
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    starts = b.starts(5)
    for row, s in zip(x, starts):
        assert torch.equal(row, torch.arange(s, s + 32))  # a contiguous window
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    # Resuming: a fresh object at step 5 gives what a run through steps 0..5 saw.
    run = TrainBatches(tokens, 8, 32, seed=3)
    seen = [run.batch(i) for i in range(6)]
    assert torch.equal(seen[5][0], x) and torch.equal(seen[5][1], y)
    assert not torch.equal(seen[4][0], x)
    assert not torch.equal(TrainBatches(tokens, 8, 32, seed=4).batch(5)[0], x)
    # Over many steps every start where a full window fits is drawn, and no other.
    short = TrainBatches(np.arange(40, dtype=np.uint16), batch_size=8, seq_len=8, seed=0)
    drawn = np.concatenate([short.starts(i) for i in range(200)])
    assert set(drawn.tolist()) == set(range(40 - 8))
    tiny = TrainBatches(np.arange(5, dtype=np.uint16), 4, 4, seed=0)
    assert torch.equal(tiny.batch(0)[1][:, -1], torch.full((4,), 4))
    with pytest.raises(ValueError, match="seq_len"):
        TrainBatches(np.arange(4, dtype=np.uint16), 1, 4, seed=0)


def test_train_batches_on_the_corpus(bilingual):
    _, data, _ = bilingual
    b = TrainBatches(data.train_tokens(), batch_size=4, seq_len=256, seed=0)
    x, y = b.batch(123)
    assert x.shape == (4, 256) and 0 <= int(x.min()) and int(y.max()) < data.vocab_size
    assert torch.equal(x, TrainBatches(data.train_tokens(), 4, 256, seed=0).batch(123)[0])


def test_val_batches_fixed_and_sequential():
    val = np.arange(1000, dtype=np.uint16)
    first = val_batches(val, batch_size=3, seq_len=10, max_tokens=95)
    second = val_batches(val, batch_size=3, seq_len=10, max_tokens=95)
    assert [len(x) for x, _ in first] == [3, 3, 3]  # 95 // 10 = 9 windows
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, second))
    x = torch.cat([x for x, _ in first])
    y = torch.cat([y for _, y in first])
    assert torch.equal(x.flatten(), torch.arange(90))  # consecutive, non-overlapping
    assert torch.equal(y.flatten(), torch.arange(1, 91))
    everything = val_batches(val, batch_size=64, seq_len=10)
    assert [len(x) for x, _ in everything] == [64, 35]  # (1000 - 1) // 10 = 99 windows
    assert val_batches(val, 4, 10, max_tokens=0) == []
    with pytest.raises(ValueError):
        val_batches(val[:10], 4, 10)


def test_text_corpus(tmp_path):
    (tmp_path / "a.txt").write_text(
        "First paragraph about apples.\nStill the first.\n\nSecond one, pears.\n\n\n"
        "Third: 第三段中文。\n\nSecond one, pears.\n", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl").write_text(
        "\n".join(json.dumps({"text": f"json document number {i} with words"}) for i in range(6)),
        encoding="utf-8")
    cfg = TextData(paths=(str(tmp_path / "*.txt"), str(tmp_path / "**/*.jsonl")),
                     vocab_size=300, val_fraction=0.2, cache_dir=str(tmp_path / "cache"))
    data = prepare(cfg, log=lambda _: None)
    assert data.meta["n_docs"] == 3 + 6  # the repeated paragraph is dropped
    assert (data.meta["n_train_docs"], data.meta["n_val_docs"]) == (7, 2)
    assert data.vocab_size <= 300 and data.eot_id == 0
    tok = data.tokenizer()
    for s in ("Third: 第三段中文。", "First paragraph about apples.\nStill the first."):
        assert tok.decode(tok.encode(s).ids) == s
    assert int((data.val_tokens() == 0).sum()) == 2
    # The cache key is the content: same bytes -> same dir, an edit -> a new one.
    assert prepare(cfg, log=lambda _: None).dir == data.dir
    (tmp_path / "a.txt").write_text("Changed.\n\nText.\n", encoding="utf-8")
    assert prepare(cfg, log=lambda _: None).dir != data.dir


def test_tokens_corpus(tmp_path):
    arr = (np.arange(20_000) * 7 % 500).astype(np.uint16)
    arr.tofile(tmp_path / "train.bin")
    cfg = TokensData(paths=(str(tmp_path / "train.bin"),), vocab_size=500,
                     cache_dir=str(tmp_path / "cache"))
    data = prepare(cfg, log=lambda _: None)
    assert data.tokenizer_path is None and data.vocab_size == 500
    assert np.array_equal(data.train_tokens(), arr[:19_000])  # last 5% is val
    assert np.array_equal(data.val_tokens(), arr[19_000:])
    assert data.unigram_entropy == pytest.approx(unigram_entropy(arr[19_000:]))
    assert not any(p.suffix == ".bin" for p in data.dir.iterdir())  # nothing copied

    val = np.arange(300, dtype=np.uint32)
    arr.astype(np.uint32).tofile(tmp_path / "t32.bin")
    val.tofile(tmp_path / "v32.bin")
    two = TokensData(paths=(str(tmp_path / "t32.bin"), str(tmp_path / "v32.bin")),
                     dtype="uint32", vocab_size=500, cache_dir=str(tmp_path / "cache"))
    data2 = prepare(two, log=lambda _: None)
    assert len(data2.train_tokens()) == 20_000 and np.array_equal(data2.val_tokens(), val)

    small = TokensData(paths=cfg.paths, vocab_size=499, cache_dir=cfg.cache_dir)
    with pytest.raises(ConfigError, match=r"data.vocab_size=499 .*holds id 499"):
        prepare(small, log=lambda _: None)


@pytest.mark.parametrize("kwargs, key", [
    ({"corpus": "wiki"}, "data.corpus"),
    ({"vocab_size": 100}, "data.vocab_size"),
    ({"vocab_size": 4096.0}, "data.vocab_size"),
    ({"val_fraction": 0.0}, "data.val_fraction"),
    ({"val_fraction": 0.6}, "data.val_fraction"),
    ({"split_seed": -1}, "data.split_seed"),
    ({"paths": ("x.txt",)}, "data.paths"),  # bilingual takes no paths
    ({"corpus": "text"}, "data.paths"),
    ({"corpus": "text", "paths": ("/nonexistent/*.txt",)}, "data.paths"),
    ({"corpus": "tokens", "paths": ("/nonexistent.bin",)}, "data.paths"),
    ({"dtype": "int8"}, "data.dtype"),
])
def test_bad_config_names_the_key(kwargs, key):
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.") + "="):
        data_config_from_dict(kwargs)


def test_bad_text_and_token_files(tmp_path):
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(ConfigError, match="only .txt/.jsonl"):
        TextData(paths=(str(tmp_path / "notes.md"),))
    (tmp_path / "odd.bin").write_bytes(b"\x00\x01\x02")
    with pytest.raises(ConfigError, match="not a non-empty array of uint16"):
        TokensData(paths=(str(tmp_path / "odd.bin"),))
    with pytest.raises(ConfigError, match="no file matches"):
        TextData(paths=(str(tmp_path / "*.txt"),))


def test_concurrent_prepare_keeps_the_winner(tmp_path, monkeypatch):
    """A process that finishes second discards its copy and uses the first one's."""
    import smallinit.data.pipeline as data_mod

    (tmp_path / "a.txt").write_text("one\n\ntwo\n\nthree\n\nfour\n", encoding="utf-8")
    cfg = TextData(paths=(str(tmp_path / "a.txt"),), vocab_size=260,
                     val_fraction=0.25, cache_dir=str(tmp_path / "cache"))
    build = data_mod._build_text
    winner, calls = [], []

    def racing_build(c, out):
        calls.append(out)
        if len(calls) == 1:  # a rival starts and finishes while this build is running
            winner.append(prepare(c, log=lambda _: None))
        return build(c, out)

    monkeypatch.setattr(data_mod, "_build_text", racing_build)
    got = prepare(cfg, log=lambda _: None)
    assert got.dir == winner[0].dir and len(calls) == 2 and not calls[0].exists()
    assert (got.dir / "meta.json").stat().st_mtime_ns == (winner[0].dir / "meta.json").stat().st_mtime_ns
    assert [p.name for p in cfg.cache_path.iterdir()] == [got.dir.name]  # temp dir removed


@pytest.mark.parametrize("damage", ["cut", "changed", "missing", "meta"])
def test_a_damaged_cache_is_named_set_aside_and_prepared_again(tmp_path, damage):
    (tmp_path / "a.txt").write_text("\n\n".join(f"paragraph {i} with some words in it" for i in range(40)),
                                    encoding="utf-8")
    cfg = TextData(paths=(str(tmp_path / "a.txt"),), vocab_size=300, cache_dir=str(tmp_path / "cache"))
    first = prepare(cfg, log=lambda _: None)
    tokens = np.array(first.train_tokens())
    assert set(first.meta["files"]) == {"train.bin", "val.bin", "tokenizer.json", "split.npz"}
    train = first.dir / "train.bin"
    if damage == "cut":
        train.write_bytes(train.read_bytes()[:-2])
    elif damage == "changed":  # same size, other bytes: only the checksum sees it
        raw = bytearray(train.read_bytes())
        raw[0] ^= 1
        train.write_bytes(bytes(raw))
    elif damage == "missing":
        (first.dir / "tokenizer.json").unlink()
    else:
        (first.dir / "meta.json").write_text("{")
    messages = []
    again = prepare(cfg, log=messages.append)
    assert again.dir == first.dir and np.array_equal(np.array(again.train_tokens()), tokens)
    assert "is damaged (" in messages[0] and "set aside as" in messages[0] and "preparing it again" in messages[0]
    aside = [p.name for p in cfg.cache_path.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].startswith(first.dir.name)  # kept, not deleted
    assert "cache hit" in (prepare(cfg, log=messages.append), messages[-1])[1]


def test_a_cache_written_before_files_were_recorded_is_checked_by_its_token_counts(tmp_path):
    (tmp_path / "a.txt").write_text("\n\n".join(f"paragraph {i}" for i in range(40)), encoding="utf-8")
    cfg = TextData(paths=(str(tmp_path / "a.txt"),), vocab_size=300, cache_dir=str(tmp_path / "cache"))
    data = prepare(cfg, log=lambda _: None)
    meta = json.loads((data.dir / "meta.json").read_text())
    del meta["files"]
    (data.dir / "meta.json").write_text(json.dumps(meta))
    assert cache_damage(data.dir) is None
    (data.dir / "val.bin").write_bytes((data.dir / "val.bin").read_bytes()[:-2])
    assert cache_damage(data.dir).startswith("val.bin holds ")


def test_text_reads_parquet_with_the_reader_make_shards_uses(tmp_path):
    # One reader of text sources: data=text and make_shards see the same documents of a file.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from smallinit.data import corpus, make_shards

    texts = ["first document", None, "   ", "second, 二"]
    pq.write_table(pa.table({"text": texts, "id": [1, 2, 3, 4]}), tmp_path / "part.parquet")
    (tmp_path / "same.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ("first document", "second, 二")))
    TextData(paths=(str(tmp_path / "part.parquet"),))  # accepted, where it was refused before
    got = [d.text for d in corpus.read_text_file(tmp_path / "part.parquet")]
    assert got == ["first document", "second, 二"] == [d.text for d in corpus.read_text_file(tmp_path / "same.jsonl")]
    assert list(make_shards.documents([tmp_path / "part.parquet"])) == got
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="has no 'text' column"):
        corpus.read_text_file(tmp_path / "other.parquet")


def test_make_shards_writes_only_into_a_new_folder_or_over_its_own_earlier_shards(tmp_path):
    """A user's file in OUT_DIR is refused, always; an earlier run's shards need --overwrite, and
    then go whole: a stale shard of a run with more shards never sits beside the new ones."""
    from smallinit.data import make_shards

    text = tmp_path / "text"
    text.mkdir()
    (text / "a.txt").write_text("\n\n".join(f"document {i} about the number {i * 7} and its friends" for i in range(200)))
    out = tmp_path / "shards"
    quiet = dict(vocab_size=300, val_fraction=0.1, log=lambda *_: None)
    many = make_shards.make_shards(text, out, shard_tokens=500, **quiet)
    assert len(many["train_shards"]) > 2
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError, match=r"holds shards made earlier: give another folder, or --overwrite to replace "
                                         r"them \(nothing was written\)"):
        make_shards.make_shards(text, out, shard_tokens=10**6, **quiet)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    one = make_shards.make_shards(text, out, shard_tokens=10**6, overwrite=True, **quiet)
    assert one["train_shards"] == ["train_000000.bin"]
    assert sorted(p.name for p in out.iterdir()) == sorted(["shards.json", "tokenizer.json", "train_000000.bin",
                                                            *one["val_shards"]])
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files make_shards did not write \(notes.txt\)"):
        make_shards.make_shards(text, out, shard_tokens=10**6, overwrite=True, **quiet)
    assert (out / "notes.txt").read_text() == "mine" and (out / "shards.json").exists()


def test_make_shards_after_a_failed_or_killed_run_is_not_locked_out(tmp_path):
    from smallinit.data import make_shards

    text = tmp_path / "text"
    text.mkdir()
    (text / "a.txt").write_text("one lonely document")
    out = tmp_path / "shards"
    quiet = dict(vocab_size=300, val_fraction=0.5, log=lambda *_: None)
    with pytest.raises(ValueError, match="too few for both a train and a val side"):
        make_shards.make_shards(text, out, **quiet)
    assert not [p for p in out.iterdir() if p.suffix == ".bin"]  # its shards went with it
    (text / "a.txt").write_text("\n\n".join(f"document {i} with its words" for i in range(100)))
    assert make_shards.make_shards(text, out, **quiet)["documents"] == 100
    # A run killed before its shards.json: its shards and tokenizer are named as an earlier run's.
    (out / "shards.json").unlink()
    with pytest.raises(ValueError, match="holds shards of an earlier run that did not finish: give another folder, "
                                         "or --overwrite"):
        make_shards.make_shards(text, out, **quiet)
    assert make_shards.make_shards(text, out, overwrite=True, **quiet)["documents"] == 100
