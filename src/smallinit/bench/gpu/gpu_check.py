"""One prepared GPU check that needs only torch and numpy (no Ray, Hydra, Optuna, W&B,
tokenizers or pandas): what a lent GPU machine can show in a few minutes.

    SMALLINIT_COMMIT=<sha> python -m smallinit.bench.gpu.gpu_check --data .cache/gpu-data --out $OUT --deadline 420
    python -m smallinit.bench.gpu.gpu_check --data ~/.cache/smallinit/bilingual-* --tiny --device cpu   # a smoke run

Units, in this order (a lent machine's time is short: the most telling first):
1. MFU of the 0.1B preset, bf16 autocast + torch.compile, sequence 2048, random tokens
   (bench/gpu/gpu_bench.py's measurement).
2. The 0.1B preset trained by the project's own loop (trainer.loop.run_trial, bf16 and compile
   on CUDA, train=gpu's batch 32 x 2048) at gamma = 0.5 and gamma = 1 (eps 1e-12, no gate, the
   same init seed and data order), each at two learning rates (both gammas at the first lr
   before the second), for one token budget: at most MAX_EPOCHS passes over the prepared corpus
   (a folder with train.bin and val.bin of uint16 token ids, e.g. the project's bilingual
   cache). One seed and a budget far below 20 tokens per parameter: a check that the recipe
   trains on a GPU at this size, not a test of the paper's claim.
3. FSDP on one device: the 0.1B preset trained a few steps by run_trial under a 1-rank process
   group (nccl on CUDA, gloo on the CPU) with trainer.distributed.Parallel("fsdp")'s sharding,
   against the same steps unsharded (same seed and data): tokens/s, peak memory and the losses.
   In fp32 (the CPU) they agree to 1e-5 relative; in bf16 (CUDA) the difference is reported.
4. MFU of the 1.5B preset (its compile alone takes minutes).

gpu_check.json is rewritten after each unit with the provenance stamp (core.provenance; the
commit from --commit or $SMALLINIT_COMMIT when given, since the .git that travels to a lent
machine may be absent or older than the files), the GPU, and per unit its
result, its error and traceback, or "skipped" when --deadline had passed before it began.

Prepare the data folder on a machine with the project installed (`make sweep` prepares it):
    mkdir -p .cache/gpu-data && cp ~/.cache/smallinit/bilingual-*/{train,val}.bin .cache/gpu-data/
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from smallinit.core import written
from smallinit.core.errors import ConfigError, first_line
from smallinit.core.trial_dir import TrialDir

from .gpu_bench import gpu_train_preset

MAX_EPOCHS = 4  # more passes than this measure memorisation, not the paper's question
PRESETS = ("0.1b", "1.5b")
GAMMAS = (0.5, 1.0)
LRS = (1e-3, 3e-3)
FSDP_STEPS, FSDP_STEPS_TINY = 20, 4
FSDP_RTOL = 1e-5  # sharded against unsharded losses, in fp32
# --units arms: the project's two arms (conf/arm/) at the 0.1B preset, each arm's lr chosen on a
# tune seed from a x2 grid, then compared on confirm seeds at that lr (the sweeps' protocol).
ARMS = {"baseline": dict(gamma=0.5, eps=1e-5, gate="none"), "small": dict(gamma=1.0, eps=1e-12, gate="elementwise")}
ARM_LRS = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)
TUNE_SEED, CONFIRM_SEEDS = 100, (1, 2, 3)


def trial_for(preset: str, gamma: float, lr: float, data: Path, vocab: int, budget: int, device: str, tiny: bool,
              eps: float = 1e-12, gate: str = "none", seed: int = 0):
    from smallinit.data.config import TokensData
    from smallinit.model.config import AttnConfig, InitConfig, ModelConfig, NormConfig
    from smallinit.trainer.config import OptimConfig, TrainConfig, TrialConfig

    model = ModelConfig.preset(preset, vocab_size=vocab, init=InitConfig(gamma=gamma, seed=seed), norm=NormConfig(eps=eps),
                               attn=AttnConfig(gate=gate))
    # train=gpu's batch and sequence (conf/train/gpu.yaml), evaluated at its cadence or 8 times
    # over this short budget, whichever is more often, on the whole validation split.
    preset_train = gpu_train_preset()
    batch, seq = (4, 64) if tiny else (int(preset_train["batch_size"]), int(preset_train["seq_len"]))
    steps = max(budget, batch * seq) // (batch * seq)
    every = 5 if tiny else min(int(preset_train["eval_every"]), max(1, steps // 8))
    train = TrainConfig(seed=seed, batch_size=batch, seq_len=seq, max_tokens=max(budget, batch * seq),
                        eval_every=every, eval_tokens=batch * seq * (1 if tiny else 2),
                        per_token_eval_tokens=batch * seq, probe_every=0, ckpt_every=0, device=device,
                        dtype="auto", compile=device == "cuda")
    data_cfg = TokensData(paths=(str(data / "train.bin"), str(data / "val.bin")), dtype="uint16",
                          vocab_size=vocab, cache_dir=str(data / ".prepared"))
    return TrialConfig(model=model, optim=OptimConfig(lr=lr), train=train, data=data_cfg, preset=preset)


def mfu_units(device: torch.device, tiny: bool, log) -> list[tuple[str, object]]:
    """(name, thunk) per preset: bench/gpu/gpu_bench.py's MFU measurement."""
    from .gpu_bench import _measure, _try

    if device.type != "cuda":  # the smoke form: shapes only
        return [("mfu-nano-cpu-smoke", lambda: _try("nano", 2, device, 2, seq_len=64, compile=False))]

    def one(preset: str):
        def measure() -> dict:
            r = _measure(preset, device, 10)
            log(f"mfu {preset}: " + (r["error"] if "error" in r else f"{r['tokens_per_s']:,.0f} tok/s, MFU {r['mfu']:.1%}"))
            return r
        return measure

    return [(f"mfu-{preset}", one(preset)) for preset in PRESETS]


def corpus(data: Path) -> tuple[int, int]:
    """(training tokens, vocabulary size) of a folder of train.bin and val.bin."""
    train_tokens = np.memmap(data / "train.bin", dtype=np.uint16, mode="r")
    vocab = int(max(int(train_tokens.max()), int(np.memmap(data / "val.bin", dtype=np.uint16, mode="r").max())) + 1)
    return len(train_tokens), 64 * -(-vocab // 64)  # rounded up: the embedding table's rows stay aligned


def fsdp_section(args, device: torch.device, log) -> dict:
    """The same few steps unsharded and under FSDP2 on one rank (section 3 above)."""
    import dataclasses
    import gc
    import socket

    import torch.distributed as dist

    from smallinit.trainer.distributed import Parallel
    from smallinit.trainer.loop import run_trial

    cuda = device.type == "cuda"
    if cuda:
        device = torch.device("cuda", torch.cuda.current_device())  # Parallel sets it: it needs an index
    _, vocab = corpus(args.data)
    preset, steps = ("nano", FSDP_STEPS_TINY) if args.tiny else ("0.1b", FSDP_STEPS)
    dtype = "bf16" if cuda else "fp32"
    base = trial_for(preset, 1.0, 1e-3, args.data, vocab, 0, device.type, args.tiny)
    t = base.train
    trial = dataclasses.replace(base, train=dataclasses.replace(
        t, max_tokens=None, max_steps=steps, log_every=1, eval_every=steps, eval_tokens=t.tokens_per_step,
        per_token_eval_tokens=t.tokens_per_step, dtype=dtype, compile=False, parallel="fsdp"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    try:
        sides = {}
        warm = dataclasses.replace(trial, train=dataclasses.replace(trial.train, max_steps=1, eval_every=1))
        # A one-step run of each side first, untimed: kernels, allocator, FSDP's lazy set-up. The
        # smoke form checks the losses only, so it skips them.
        names = ("unsharded", "fsdp") if args.tiny else ("warmup-unsharded", "warmup-fsdp", "unsharded", "fsdp")
        for name in names:
            out = TrialDir(args.out / f"fsdp-{name}")
            shutil.rmtree(out.path, ignore_errors=True)  # a finished trial there would be read, not run
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            res = run_trial(warm if name.startswith("warmup") else trial, out.path, log=lambda *_: None,
                            dist=Parallel("fsdp", device) if name.endswith("fsdp") else None)
            if name.startswith("warmup"):
                shutil.rmtree(out.path, ignore_errors=True)
                continue
            rows = out.metrics_rows()
            sides[name] = {"tokens_per_s": res.tokens_per_s, "final_val_loss": res.final_val_loss,
                           "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                           "train_loss": [[r["step"], r["train/loss"]] for r in rows if r.get("train/loss") is not None]}
            for f in (out.model_weights, out.per_token_losses):
                f.unlink(missing_ok=True)
    finally:
        dist.destroy_process_group()
    a, b = sides["unsharded"], sides["fsdp"]
    pairs = [(x[1], y[1]) for x, y in zip(a["train_loss"], b["train_loss"])] + [(a["final_val_loss"], b["final_val_loss"])]
    worst = max(abs(y - x) / abs(x) for x, y in pairs)
    out = {"preset": preset, "steps": steps, "dtype": dtype, "backend": "nccl" if cuda else "gloo", "world": 1,
           "tokens_per_step": trial.train.tokens_per_step, "max_rel_loss_diff": worst,
           # fp32 is held to 1e-5; in bf16 the two sides' rounding differs, so it is reported only.
           "losses_agree": worst <= FSDP_RTOL if dtype == "fp32" else None,
           "memory_note": "peak allocated over the whole run; under fsdp rank 0 also keeps the whole copy it "
                          "evaluates with (Parallel.full_model)" if cuda else "not measured on the CPU", **sides}
    log(f"fsdp {preset} ({dtype}, 1 rank): {b['tokens_per_s']:,.0f} tok/s against {a['tokens_per_s']:,.0f} unsharded"
        + (f", peak {b['peak_memory_gb']:.1f} GB against {a['peak_memory_gb']:.1f}" if cuda else "")
        + f"; losses differ by {worst:.2e} relative at most")
    return out


def train_units(args, device: torch.device, log) -> list[tuple[str, object]]:
    """(name, thunk) per (gamma, lr): both gammas at the first lr before either at the second, so a
    run cut short still compares the two."""
    from smallinit.trainer.loop import run_trial

    n_train, vocab = corpus(args.data)
    budget = min(args.tokens, MAX_EPOCHS * n_train)
    preset = "nano" if args.tiny else "0.1b"
    log(f"train {preset}: {budget:,} tokens per run ({budget / n_train:.2f} passes over "
        f"{n_train:,} training tokens), vocab {vocab}")

    def one(gamma: float, lr: float):
        def train() -> dict:
            trial = trial_for(preset, gamma, lr, args.data, vocab, budget, device.type, args.tiny)
            out = TrialDir(args.out / f"run-g{gamma:g}-lr{lr:g}")
            shutil.rmtree(out.path, ignore_errors=True)  # an earlier check's run would be returned as finished
            t0 = time.perf_counter()
            res = run_trial(trial, out.path, log=lambda *_: None)
            rows = out.metrics_rows()
            for f in (out.model_weights, out.per_token_losses):
                f.unlink(missing_ok=True)  # the JSON is the record; weights would not come back anyway
            log(f"train γ={gamma:g} lr={lr:g}: val loss {res.final_val_loss:.4f} ({res.tokens_per_s:,.0f} tok/s, "
                f"{time.perf_counter() - t0:.0f} s)")
            return dict(preset=preset, gamma=gamma, lr=lr, eps=1e-12, tokens=res.tokens, dtype=res.dtype,
                        batch_size=trial.train.batch_size, seq_len=trial.train.seq_len, passes=budget / n_train,
                        final_val_loss=res.final_val_loss, unigram_entropy=res.unigram_entropy,
                        tokens_per_s=res.tokens_per_s, mfu=res.mfu, wall_s=time.perf_counter() - t0,
                        val_curve=[[r["step"], r["val/loss"]] for r in rows if r.get("val/loss") is not None],
                        train_curve=[[r["step"], r["train/loss"]] for r in rows if r.get("train/loss") is not None])
        return train

    return [(f"train-g{gamma:g}-lr{lr:g}", one(gamma, lr)) for lr in LRS for gamma in GAMMAS]


def arms_units(args, device: torch.device, rec: Record, log) -> list[tuple[str, object]]:
    """Tune units (every arm x lr on TUNE_SEED), then confirm units (every arm x confirm seed at
    the lr its tune units chose; the lowest final validation loss among those that finished)."""
    from smallinit.trainer.loop import run_trial

    n_train, vocab = corpus(args.data)
    budget = min(args.tokens, MAX_EPOCHS * n_train)
    preset = "nano" if args.tiny else "0.1b"
    log(f"arms {preset}: {budget:,} tokens per run ({budget / n_train:.2f} passes), lr grid {ARM_LRS}")

    def run(arm: str, lr: float, seed: int, role: str) -> dict:
        trial = trial_for(preset, ARMS[arm]["gamma"], lr, args.data, vocab, budget, device.type, args.tiny,
                          eps=ARMS[arm]["eps"], gate=ARMS[arm]["gate"], seed=seed)
        out = TrialDir(args.out / f"arms-{arm}-lr{lr:g}-s{seed}")
        shutil.rmtree(out.path, ignore_errors=True)  # an earlier check's run would be returned as finished
        res = run_trial(trial, out.path, log=lambda *_: None)
        rows = out.metrics_rows()
        for f in (out.model_weights, out.per_token_losses):
            f.unlink(missing_ok=True)
        log(f"arms {role} {arm} lr={lr:g} seed={seed}: val loss {res.final_val_loss:.4f} ({res.tokens_per_s:,.0f} tok/s)")
        return dict(role=role, arm=arm, **ARMS[arm], lr=lr, seed=seed, preset=preset, tokens=res.tokens, dtype=res.dtype,
                    final_val_loss=res.final_val_loss, tokens_per_s=res.tokens_per_s, mfu=res.mfu,
                    val_curve=[[r["step"], r["val/loss"]] for r in rows if r.get("val/loss") is not None])

    def chosen(arm: str) -> float:
        tuned = [u for u in rec.data["units"].values() if u.get("role") == "tune" and u.get("arm") == arm
                 and u.get("final_val_loss") is not None]
        if not tuned:
            raise RuntimeError(f"no tune run of arm {arm} finished: nothing to choose its lr from")
        return min(tuned, key=lambda u: u["final_val_loss"])["lr"]

    units = [(f"arms-tune-{arm}-lr{lr:g}", lambda arm=arm, lr=lr: run(arm, lr, TUNE_SEED, "tune"))
             for arm in ARMS for lr in ARM_LRS]
    # Seed by seed, both arms: a run cut short still holds whole pairs.
    units += [(f"arms-confirm-{arm}-s{seed}", lambda arm=arm, seed=seed: run(arm, chosen(arm), seed, "confirm"))
              for seed in CONFIRM_SEEDS for arm in ARMS]
    return units


class Record:
    """gpu_check.json, rewritten after every unit of work, so a run cut short by the machine's
    time limit still brings back what it finished. A unit that raises is recorded with its error
    and the next one runs; a unit not started before the deadline is recorded as skipped."""

    def __init__(self, path: Path, deadline_s: float | None, head: dict, overwrite: bool = False):
        self.path, self.deadline_s, self.t0 = path, deadline_s, time.perf_counter()
        self.data = {**head, "units": {}}
        self.adopt = overwrite  # the first write only: from then on the file is this run's
        self.write()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def write(self) -> None:
        """Atomically, and never over a gpu_check.json an earlier run left (core/written.py)."""
        self.data["elapsed_s"] = self.elapsed()
        written.write_outputs(self.path.parent, {self.path.name: json.dumps(self.data, indent=1) + "\n"},
                              by="smallinit.bench.gpu.gpu_check", adopt=self.adopt)
        self.adopt = False

    def run(self, name: str, fn, log) -> None:
        if self.deadline_s is not None and self.elapsed() > self.deadline_s:
            self.data["units"][name] = {"skipped": f"deadline: {self.elapsed():.0f} s past, --deadline {self.deadline_s:g}"}
            log(f"{name}: skipped (deadline)")
        else:
            t0 = time.perf_counter()
            try:
                out = fn()
            except Exception as e:  # one broken unit must not cost the others on a one-shot machine
                import traceback

                out = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
                log(f"{name}: FAILED {out['error']}")
            self.data["units"][name] = {**out, "unit_wall_s": time.perf_counter() - t0}
        self.write()


def machine(device: torch.device) -> dict:
    out = {"device": device.type}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(gpu=props.name, capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count,
                   memory_gib=props.total_memory / 2**30, cuda=torch.version.cuda,
                   bf16_supported=torch.cuda.is_bf16_supported())
    return out


def _refused(a) -> str | None:
    """Why these arguments cannot run, in one line; None when they can."""
    for f in ("train.bin", "val.bin"):
        if not (a.data / f).is_file() or (a.data / f).stat().st_size < 2:
            return f"--data {a.data}: no {f} of uint16 token ids there (see `python -m smallinit.bench.gpu.gpu_check --help`)"
    try:
        torch.device(a.device)
    except RuntimeError as e:
        return f"--device={a.device} is invalid: {first_line(e)}"
    if a.out.exists() and not a.out.is_dir():
        return f"--out={a.out} is invalid: it is a file; give a folder"
    # An earlier run's record is never written over unasked, even one of ours: a lent GPU's
    # minutes made it, and the next lent machine may never come.
    if (a.out / "gpu_check.json").exists() and not a.overwrite:
        return (f"--out={a.out} holds gpu_check.json from an earlier run: give another --out, or --overwrite to "
                "replace it (nothing was written)")
    try:
        written.check(a.out, ["gpu_check.json"], adopt=a.overwrite)
    except ConfigError as e:
        return str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m smallinit.bench.gpu.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True, help="folder with train.bin and val.bin (uint16 token ids)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check")), help="where gpu_check.json goes")
    p.add_argument("--tokens", type=int, default=20_000_000, help=f"token budget per run (capped at {MAX_EPOCHS} passes)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="nano model, a few steps: a smoke run anywhere")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds after which no new unit starts (each is recorded as skipped); the machine's time limit")
    p.add_argument("--commit", default=os.environ.get("SMALLINIT_COMMIT"),
                   help="the commit the copied files are, where the .git beside them is absent or stale; "
                        "it wins over git's view, which is kept beside it (default $SMALLINIT_COMMIT)")
    p.add_argument("--units", choices=("check", "arms"), default="check",
                   help="check: MFU, both gammas, FSDP (the default); arms: the two arms under the tune/confirm protocol")
    p.add_argument("--skip-mfu", action="store_true")
    p.add_argument("--skip-fsdp", action="store_true")
    p.add_argument("--overwrite", action="store_true", help="replace a gpu_check.json an earlier run left in --out")
    a = p.parse_args(argv)
    why = _refused(a)  # everything a unit would trip on, before the first is written: a lent GPU's time is short
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(a.device)

    def log(msg: str) -> None:
        print(f"[gpu_check] {msg}", flush=True)

    from smallinit.core import provenance

    stamp = provenance.record()
    if a.commit:
        # The copy on a lent machine may carry no .git, or one older than its files (the device
        # tool copied the .git of the session's start); the caller names the commit the files are.
        stamp.update(commit=a.commit, dirty=False, uncommitted=None, commit_from="--commit",
                     git_on_this_machine={"commit": stamp["commit"], "uncommitted": stamp["uncommitted"]})
    stamp["machine"]["accelerator"] = machine(device)
    rec = Record(a.out / "gpu_check.json", a.deadline, {"provenance": stamp, "argv": sys.argv[1:] if argv is None else argv},
                 overwrite=a.overwrite)
    log(f"{stamp['machine']['accelerator']}, torch {torch.__version__}, commit {stamp['commit']}")
    # In the order of what only a GPU can show: the small preset's MFU, then both gammas trained,
    # then FSDP's cost, then the large preset's MFU (its compile alone takes minutes).
    if a.units == "arms":
        for name, fn in arms_units(a, device, rec, log):
            rec.run(name, fn, log)
        log(f"wrote {rec.path} in {rec.elapsed():.0f} s")
        return 0
    mfu = [] if a.skip_mfu else mfu_units(device, a.tiny, log)
    if mfu:
        rec.run(*mfu[0], log)
    for name, fn in train_units(a, device, log):
        rec.run(name, fn, log)
    if not a.skip_fsdp:
        rec.run("fsdp", lambda: fsdp_section(a, device, log), log)
    for unit in mfu[1:]:
        rec.run(*unit, log)
    log(f"wrote {rec.path} in {rec.elapsed():.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
