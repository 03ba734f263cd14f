"""Export a trained trial to a Hugging Face folder: `python -m smallinit.trainer.export TRIAL_DIR OUT_DIR`.

The dense, ungated RMSNorm model is, weight for weight, transformers' LlamaForCausalLM (same
rotate-half RoPE, SwiGLU, pre-norm, fp32 norm statistics), so the export is a renaming of the
state dict plus a LlamaConfig; the tokenizer the trial trained on goes along as a
PreTrainedTokenizerFast, with <|endoftext|> declared as its bos, eos and pad token and the same
id in config.json and generation_config.json (lm-eval's HF model starts a context with it, and
generation stops at it). The folder loads in every transformers that pyproject.toml admits, not
only the one that wrote it (tests/test_export.py loads it in the oldest too): see _write_tokenizer
and _portable_config.
A data=tokens trial takes the tokenizer data/make_shards.py recorded beside its shards, or
--tokenizer. The folder then loads with `AutoModelForCausalLM.from_pretrained` and works with
lm-evaluation-harness (tests/test_lm_eval.py) or vLLM. Gated attention and MoE have no Llama equivalent:
they are refused with one line rather than exported wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from smallinit.core import trial_files
from smallinit.core.errors import ConfigError, first_line
from smallinit.core.trial_dir import TrialDir
from smallinit.data import shards
from smallinit.data.corpus import EOT
from smallinit.model.config import AttnConfig, FFNConfig, InitConfig, ModelConfig, NormConfig

from .checkpoint import check_weights_owner

# our name -> transformers' Llama name; {i} is the layer index
LLAMA_NAMES = {
    "tok_emb.weight": "model.embed_tokens.weight",
    "norm_f.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
    "blocks.{i}.norm1.weight": "model.layers.{i}.input_layernorm.weight",
    "blocks.{i}.norm2.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blocks.{i}.attn.q_proj.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blocks.{i}.attn.k_proj.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blocks.{i}.attn.v_proj.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blocks.{i}.attn.o_proj.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blocks.{i}.ffn.w1.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blocks.{i}.ffn.w3.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blocks.{i}.ffn.w2.weight": "model.layers.{i}.mlp.down_proj.weight",
}


def model_config_from_dict(d: dict) -> ModelConfig:
    """The ModelConfig a trial recorded in trial.json (its `config.model`)."""
    d = dict(d)
    return ModelConfig(norm=NormConfig(**d.pop("norm")), attn=AttnConfig(**d.pop("attn")),
                       ffn=FFNConfig(**d.pop("ffn")), init=InitConfig(**d.pop("init")), **d)


def check_exportable(cfg: ModelConfig) -> None:
    why = []
    if cfg.attn.gate != "none":
        why.append(f"model.attn.gate={cfg.attn.gate!r} (Llama has no attention output gate)")
    if cfg.ffn.type != "dense":
        why.append(f"model.ffn.type={cfg.ffn.type!r} (Llama's MLP is dense)")
    if cfg.norm.type != "rmsnorm":
        why.append(f"model.norm.type={cfg.norm.type!r} (Llama uses RMSNorm)")
    if why:
        raise ConfigError("cannot export as LlamaForCausalLM: " + "; ".join(why)
                          + ". Load such models with model.Transformer and trial.json instead.")


def llama_config(cfg: ModelConfig, eot: int | None):
    """Llama's shape settings plus the special ids: LlamaConfig's own defaults (bos 1, eos 2)
    would name two ordinary tokens of our vocabulary, so the ids are always set, None included."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm.eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings, hidden_act="silu",
        attention_bias=False, mlp_bias=False, torch_dtype="float32",
        bos_token_id=eot, eos_token_id=eot, pad_token_id=eot,
    )


def llama_state_dict(state: dict, n_layers: int) -> dict:
    names = {}
    for ours, theirs in LLAMA_NAMES.items():
        for i in range(n_layers) if "{i}" in ours else [None]:
            names[ours.format(i=i)] = theirs.format(i=i)
    unknown = sorted(set(state) - set(names))
    if unknown:
        raise ConfigError(f"cannot export: parameters with no Llama equivalent: {unknown[:5]}")
    return {names[k]: v.detach().float().contiguous() for k, v in state.items()}


def export(trial_dir: Path, out_dir: Path, tokenizer: Path | None = None, overwrite: bool = False) -> Path:
    """Write out_dir (config.json, model.safetensors, tokenizer files) for trial_dir's model.pt.
    out_dir must be new, empty, or an earlier export of this trial; with `overwrite`, also an
    earlier export of another trial (the files that export listed are replaced, nothing else)."""
    import torch

    folder = TrialDir(trial_dir)
    try:
        record = folder.read_trial()
    except (OSError, ValueError) as e:  # a damaged trial.json: the model's shape cannot be known
        raise ConfigError(f"{first_line(e)}: restore it (sweep.json in the same folder holds the same config) "
                          "before exporting") from None
    if record is None:
        raise ConfigError(f"{folder.path} has no trial.json: is it a trial folder?")
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise ConfigError(f"{folder.trial_json} holds no trial config: restore it before exporting")
    if not folder.model_weights.is_file():
        kept_none = record["config"].get("train", {}).get("keep_weights") is False
        raise ConfigError(f"{folder.model_weights} does not exist: " + (
            "the trial trained with train.keep_weights=false, so it kept no weights to export" if kept_none
            else "the trial has not finished"))
    changed = {n: why for n, why in folder.changed_files(weights=True).items()
               if n in (folder.trial_json.name, folder.model_weights.name)}
    if changed:  # held against what the finished trial listed in result.json (core/trial_files.py)
        raise ConfigError(f"{folder.path}: {trial_files.describe(changed)}: the export would not be this trial's "
                          "model; restore the trial's own file, or rerun its sweep to train it again")
    cfg = model_config_from_dict(record["config"]["model"])
    check_exportable(cfg)
    # Settled before anything is written, so a refusal leaves no half-made folder.
    out_dir = Path(out_dir)
    _check_out_dir(out_dir)
    earlier = _earlier_export(out_dir, record["identity"], overwrite)
    state = _read_weights(folder.model_weights, torch, record.get("identity"), folder.trial_json)
    tok_file = Path(tokenizer) if tokenizer else _trained_tokenizer(record["config"]["data"])
    eot = _end_of_text_id(tok_file, cfg.vocab_size) if tok_file is not None else None
    # Read now: --tokenizer may name the earlier export's own tokenizer.json, which goes below.
    tok_json = tok_file.read_bytes() if tok_file is not None else None
    hf = llama_state_dict(state, cfg.n_layers)
    if cfg.tie_embeddings:
        hf.pop("lm_head.weight", None)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(llama_config(cfg, eot))
    missing, unexpected = model.load_state_dict(hf, strict=False)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"export mapping incomplete: missing {missing[:5]}, unexpected {unexpected[:5]}")
    (out_dir / MARK).unlink(missing_ok=True)  # an export cut short below leaves no mark: it is nobody's
    for name in earlier:
        (out_dir / name).unlink(missing_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)  # config.json and generation_config.json
    _portable_config(out_dir / "config.json", cfg)
    if tok_json is not None:
        _write_tokenizer(out_dir, tok_json, eot is not None, cfg.max_seq_len)
    files = {str(p.relative_to(out_dir)): trial_files.sha256(p) for p in sorted(out_dir.rglob("*")) if p.is_file()}
    (out_dir / MARK).write_text(json.dumps({"identity": record["identity"], "config": record["config"],
                                            "files": files}, indent=2))
    return out_dir


# Written last into an export folder: whose model it holds and every file the export wrote with its
# sha256, so a later export knows what it may replace (only those, as written) and what it must not
# touch (the rest, and a written file edited since). A mark from before the hashes lists names only.
MARK = "smallinit.json"


def _earlier_export(out_dir: Path, identity: str, overwrite: bool) -> list[str]:
    """The files of an earlier export in out_dir that this one replaces; [] for a new or empty
    folder. A folder holding anything an export did not write is refused, as is another trial's
    export without `overwrite`."""
    present = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.is_file()) if out_dir.is_dir() else []
    if not present:
        return []
    try:
        mark = json.loads((out_dir / MARK).read_text())
        files = mark.get("files") if isinstance(mark, dict) else None
        listed = files if isinstance(files, dict) else dict.fromkeys(files, None) if isinstance(files, list) else {}
    except (OSError, ValueError):
        listed, mark = {}, {}
    foreign = [f for f in present if f != MARK and f not in listed]
    if foreign or MARK not in present:
        shown = ", ".join((foreign or present)[:4]) + (" ..." if len(foreign or present) > 4 else "")
        raise ConfigError(f"OUT_DIR={out_dir} is invalid: it holds files an export did not write ({shown}); give a new "
                          "or empty folder (nothing was written)")
    if mark.get("identity") != identity and not overwrite:
        raise ConfigError(f"OUT_DIR={out_dir} is invalid: it holds the export of trial {mark.get('identity')}, not "
                          f"{identity}; give another folder, or --overwrite to replace that export's files")
    edited = [f for f, digest in listed.items() if digest is not None and (out_dir / f).is_file()
              and trial_files.sha256(out_dir / f) != digest]
    if edited and not overwrite:
        shown = ", ".join(edited[:4]) + (" ..." if len(edited) > 4 else "")
        raise ConfigError(f"OUT_DIR={out_dir} is invalid: files of its export were edited since ({shown}); give "
                          "another folder, or --overwrite to replace them (nothing was written)")
    return sorted(listed)


def _portable_config(path: Path, cfg: ModelConfig) -> None:
    """Add the keys transformers 4 reads beside those 5 writes. transformers 5 writes RoPE's base
    only inside `rope_parameters` and the dtype as `dtype`; 4.x reads `rope_theta` and
    `torch_dtype`, and without them silently takes RoPE base 10000, which gives other logits for
    any other model.rope_theta. transformers 5 reads the 4.x keys too, so both are written."""
    config = json.loads(path.read_text())
    config.setdefault("rope_theta", cfg.rope_theta)
    config.setdefault("torch_dtype", config.get("dtype", "float32"))
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _write_tokenizer(out_dir: Path, tok_json: bytes, has_eot: bool, max_len: int) -> None:
    """tokenizer.json as trained, and the two small files that say how to load it, written here
    rather than by the installed transformers' save_pretrained: transformers 5 names its own class
    (TokenizersBackend), which AutoTokenizer of 4.x cannot find. PreTrainedTokenizerFast is the
    class both know (5 keeps the name as an alias); special_tokens_map.json is where 4.x also
    looks for the special tokens. Two settings are given, not left to each version's default:
    clean_up_tokenization_spaces (4.x's True drops the spaces before punctuation that the byte-level
    BPE keeps) and model_input_names (4.x's class also returns token_type_ids, which Llama's
    generate refuses, so `model.generate(**tok(text, return_tensors="pt"))` would fail)."""
    specials = {f"{role}_token": EOT for role in ("bos", "eos", "pad")} if has_eot else {}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len,
              "model_input_names": ["input_ids", "attention_mask"], "clean_up_tokenization_spaces": False,
              **specials}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    (out_dir / "tokenizer.json").write_bytes(tok_json)


def _check_out_dir(out_dir: Path) -> None:
    """The output must be a folder, new or existing; transformers would log an error and
    write nothing where it is a file, then the tokenizer's save would raise."""
    for p in (out_dir, *out_dir.parents):
        if p.exists():
            if not p.is_dir():
                raise ConfigError(f"OUT_DIR={out_dir} is invalid: {p} is a file, not a folder; give a new or "
                                  "existing folder for the Hugging Face files")
            return


def _read_weights(path: Path, torch, identity: str | None, record: Path) -> dict:
    """model.pt's state dict, if it is trial `identity`'s (as `record`, trial.json, says). The
    trainer writes it atomically, so a file that does not load was damaged afterwards (a copy
    cut short, a full disk elsewhere)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
        if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
            raise ValueError(f"holds a {type(state).__name__} without a 'model' state dict")
    except Exception as e:  # noqa: BLE001 - truncated (RuntimeError), not a zip, not a pickle: all one answer
        if isinstance(e, MemoryError):
            raise  # the file may be fine: the machine is not
        if isinstance(e, PermissionError):
            raise ConfigError(f"{path} cannot be read: permission denied") from None
        raise ConfigError(f"{path} is unreadable ({type(e).__name__}: {first_line(e)}): copy it again from where "
                          "it came, or move the trial's result.json aside and rerun the sweep's command to "
                          "train the trial again") from None
    check_weights_owner(path, state, identity, record)
    return state["model"]


def _end_of_text_id(tok_file: Path, vocab_size: int) -> int | None:
    """<|endoftext|>'s id: the corpus's one special token, which ends every training document,
    so it is bos, eos and pad of the export (None when the tokenizer has no such token)."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(tok_file))
    except Exception as e:  # tokenizers raises a bare Exception for a file that is not its JSON
        raise ConfigError(f"--tokenizer={tok_file} is invalid: not a tokenizers JSON file ({e})") from None
    if tok.get_vocab_size() > vocab_size:
        raise ConfigError(f"--tokenizer={tok_file} is invalid: it has {tok.get_vocab_size()} tokens, more than "
                          f"the model's vocabulary (model.vocab_size={vocab_size})")
    return tok.token_to_id(EOT)


def _trained_tokenizer(data: dict) -> Path | None:
    """The tokenizer.json the trial's tokens were made with: the corpus cache's for text
    corpora, the one make_shards recorded beside the shards for data=tokens, None for tasks."""
    from smallinit.data.config import CorpusData, data_config_from_dict
    from smallinit.data.pipeline import prepare

    if data.get("corpus") == "tokens":
        try:
            return shards.recorded_tokenizer(data_config_from_dict(data).files())
        except (ConfigError, ValueError) as e:
            raise ConfigError(f"a data=tokens trial has no tokenizer to export ({e}): pass --tokenizer "
                              "FILE, the tokenizers JSON its shards were made with") from None
    cfg = data_config_from_dict(data)
    return prepare(cfg, log=lambda *_: None).tokenizer_path if isinstance(cfg, CorpusData) else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m smallinit.trainer.export", description=__doc__.split("\n")[0])
    p.add_argument("trial_dir", type=Path, help="a finished trial folder (sweeps/<name>/trials/<identity>)")
    p.add_argument("out_dir", type=Path, help="where to write the Hugging Face folder")
    p.add_argument("--tokenizer", type=Path, help="a tokenizers JSON file (default: the one the trial trained with)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier export of another trial in OUT_DIR (only the files it wrote)")
    args = p.parse_args(argv)
    try:
        out = export(args.trial_dir, args.out_dir, args.tokenizer, args.overwrite)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"error: {e.name} is not installed: make install EXTRAS=dev,dashboard,export", file=sys.stderr)
        return 2
    ids = json.loads((out / "config.json").read_text())
    print(f"exported to {out}: AutoModelForCausalLM.from_pretrained({str(out)!r}); "
          + ("no tokenizer (the trial's data has none)" if not (out / "tokenizer.json").is_file() else
             f"bos/eos/pad = {EOT} (id {ids['eos_token_id']})" if ids.get("eos_token_id") is not None else
             f"the tokenizer has no {EOT}: bos/eos/pad unset"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
