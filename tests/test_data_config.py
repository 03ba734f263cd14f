"""Typed data settings: each conf/data/*.yaml becomes its own class and gives back, key for
key, the dict it came from (trial identities hash that dict, so it must not drift)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from smallinit.core.errors import ConfigError
from smallinit.data.anchor_task import VOCAB_SIZE, AnchorData
from smallinit.data.config import BilingualData, TextData, TokensData, data_config_from_dict
from smallinit.trainer.config import trial_config_from_dict


@pytest.fixture
def user_files(tmp_path):
    (tmp_path / "a.txt").write_text("one\n\ntwo\n\nthree\n", encoding="utf-8")
    (np.arange(1000) % 300).astype(np.uint16).tofile(tmp_path / "train.bin")
    (np.arange(100) % 300).astype(np.uint16).tofile(tmp_path / "val.bin")
    return tmp_path


def corpus_overrides(files):
    return {
        BilingualData: [],
        TextData: ["data=text", f"data.paths=[{files}/a.txt]", "data.vocab_size=300"],
        TokensData: ["data=tokens", f"data.paths=[{files}/train.bin,{files}/val.bin]", "data.vocab_size=300"],
        AnchorData: ["data=anchor", "model=nano", "train=anchor"],
    }


def test_each_data_yaml_becomes_its_class_and_round_trips(compose, user_files):
    for cls, overrides in corpus_overrides(user_files).items():
        given = compose(*overrides)["data"]
        data = data_config_from_dict(given)
        assert type(data) is cls
        assert list(data.to_dict()) == list(given)  # same keys, same order
        # The same values, but for the cache folder, which null leaves to SMALLINIT_CACHE.
        assert data.to_dict() == ({**given, "cache_dir": data.cache_dir} if "cache_dir" in given else given)
        assert data_config_from_dict(data.to_dict()) == data  # a trial's record gives its data back
        trial = trial_config_from_dict(compose(*overrides))
        assert trial.data == data and trial.to_dict()["data"] == data.to_dict()
        assert trial.model.vocab_size == data.vocab_size


def test_trial_config_pickles_with_its_identity(trial_config):
    for trial in (trial_config(), trial_config("data=anchor", "model=nano", "train=anchor")):
        again = pickle.loads(pickle.dumps(trial))
        assert again == trial and again.identity() == trial.identity()


def test_anchor_vocabulary_is_the_recipes():
    assert AnchorData.vocab_size == VOCAB_SIZE == 100
    assert "vocab_size" not in AnchorData().to_dict()  # not a setting: not in the identity


@pytest.mark.parametrize("given, message", [
    ({"task": "translate"}, r"^data\.task='translate' is invalid"),
    ({"corpus": "wiki"}, r"^data\.corpus='wiki' is invalid"),
    ({"task": "anchor", "vocab_size": 50}, r"^data\.vocab_size is not a known key for task 'anchor'"),
    ({"task": "lm", "corpus": "bilingual", "n_train": 5}, r"^data\.n_train is not a known key for corpus 'bilingual'"),
])
def test_bad_data_dict_names_the_key(given, message):
    with pytest.raises(ConfigError, match=message):
        data_config_from_dict(given)


def test_missing_task_and_corpus_mean_the_bundled_corpus():
    assert data_config_from_dict({}) == BilingualData()
    assert data_config_from_dict({"vocab_size": 2048}) == BilingualData(vocab_size=2048)


def test_the_cache_folder_is_smallinit_cache_else_the_users(monkeypatch):
    monkeypatch.setenv("SMALLINIT_CACHE", "/data/cache")
    assert BilingualData().cache_dir == "/data/cache"
    monkeypatch.delenv("SMALLINIT_CACHE")
    assert BilingualData().cache_dir == "~/.cache/smallinit"
    assert BilingualData(cache_dir="/x").cache_dir == "/x"
