"""records/crossover_size.py: the recipe's effective size read from two sweep folders
(the crossover record and the baseline at other widths), each (setting, budget) at its own chosen
lr; a known N_eff/N is recovered; a widths sweep of another arm is refused; scaling_law's
committed summary gives its 16 recorded cells."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from records.crossover_size import chosen_rows, main, scaling_law_cells

VOCAB = 4096
BUDGETS = [1_000_000, 2_000_000, 4_000_000]
N_NONEMBED = {96: 0.45e6, 128: 0.8e6, 192: 1.8e6}
RATIO = 1.5  # the recipe at d = 128 trains like a baseline of 1.5x its parameters


def law(n: float, d: float) -> float:
    return 2.0 + 30.0 * n ** -0.25 + 200.0 * d ** -0.3


def _row(arm, d_model, n_nonembed, seed, lr, budget, loss, role="confirm", gamma=0.5):
    return {"state": "COMPLETE", "role": role, "config/arm": arm, "config/seed": seed, "param.model.d_model": d_model,
            "lr": lr, "budget_tokens": budget, "final_val_loss": loss, "d_model": d_model,
            "n_params": n_nonembed + 2 * VOCAB * d_model, "train_seed": seed, "config/model.vocab_size": VOCAB,
            "config/model.tie_embeddings": False, "gamma": gamma, "eps": 1e-5, "gate": "none", "norm": "rmsnorm",
            "n_layers": 4, "ffn": "dense", "dtype": "fp32", "config/model.n_heads": 2, "config/optim.schedule": "wsd",
            "config/optim.warmup_frac": 0.0125, "config/train.budgets": "[2097152, 4194304, 8388608]",
            "config/optim.weight_decay": 0.1, "config/train.batch_size": 8,
            "config/train.seq_len": 128, "config/train.cooldown_frac": 0.2, "config/train.eval_tokens": 65536,
            "config/data.task": "lm", "config/data.corpus": "bilingual", "config/data.vocab_size": VOCAB,
            "config/data.val_fraction": 0.05, "config/data.split_seed": 0}


def _write(folder: Path, rows: list[dict], choices: list[dict], drop_arm: bool = False) -> Path:
    folder.mkdir()
    df = pd.DataFrame(rows)
    if drop_arm:
        df = df.drop(columns=["config/arm"])
    else:
        df = df.drop(columns=["param.model.d_model"])
    df.to_parquet(folder / "results.parquet")
    (folder / "protocol.json").write_text(json.dumps({"per_budget": True, "choices": choices}))
    return folder


def _choice(setting: dict, lr: float) -> dict:
    return {"setting": setting, "chosen_by_budget": [{"budget_tokens": b, "chosen": {"optim.lr": lr}} for b in BUDGETS]}


def sweeps(tmp_path: Path, widths_gamma: float = 0.5):
    rng = np.random.default_rng(0)
    cross, widths = [], []
    for seed in range(1, 7):
        luck = rng.normal(0, 0.003)
        for b in BUDGETS:
            cross.append(_row("baseline", 128, N_NONEMBED[128], seed, 2e-3, b, law(N_NONEMBED[128], b) + luck))
            cross.append(_row("small", 128, N_NONEMBED[128], seed, 5e-4, b, law(RATIO * N_NONEMBED[128], b) + luck))
            cross.append(_row("small", 128, N_NONEMBED[128], seed, 2e-3, b, 9.0))  # a decoy: not the chosen lr
            for d in (96, 192):
                widths.append(_row("baseline", d, N_NONEMBED[d], seed, 2e-3, b, law(N_NONEMBED[d], b) + luck,
                                   gamma=widths_gamma))
    c = _write(tmp_path / "crossover", cross, [_choice({"arm": "baseline"}, 2e-3), _choice({"arm": "small"}, 5e-4)])
    w = _write(tmp_path / "widths", widths, [_choice({"model.d_model": d}, 2e-3) for d in (96, 192)], drop_arm=True)
    return c, w


def test_each_setting_keeps_its_chosen_lr_and_its_own_non_embedding_count(tmp_path):
    c, w = sweeps(tmp_path)
    rows = chosen_rows(c)
    assert len(rows) == 2 * 6 * len(BUDGETS) and (rows["loss"] < 9).all()
    assert set(rows["n"]) == {N_NONEMBED[128]}
    wide = chosen_rows(w)
    assert set(wide["arm"]) == {"baseline"} and set(wide["n"]) == {N_NONEMBED[96], N_NONEMBED[192]}


def test_a_known_ratio_is_read_off_the_widths_at_every_budget_and_the_joint_law_agrees(tmp_path, capsys):
    c, w = sweeps(tmp_path)
    assert main(["--crossover", str(c), "--widths", str(w), "--out", str(tmp_path / "size.md")]) == 0
    text = (tmp_path / "size.md").read_text()
    rows = [r for r in text.splitlines() if r.startswith("| 1,000,000") or r.startswith("| 4,000,000")]
    assert len(rows) == 2
    for r in rows:
        ratio = float(r.split("N_eff/N = ")[1].split(" ")[0])
        assert ratio == pytest.approx(RATIO, rel=0.05) and "6 of 6" in r
    free = next(r for r in text.splitlines() if r.startswith("| free"))
    assert float(free.split(" | ")[6]) == pytest.approx(RATIO, rel=0.1)


def test_a_widths_sweep_of_another_arm_or_schedule_is_refused(tmp_path):
    c, w = sweeps(tmp_path, widths_gamma=1.0)
    with pytest.raises(SystemExit, match="gamma"):
        main(["--crossover", str(c), "--widths", str(w)])
    table = pd.read_parquet(w / "results.parquet")
    table.assign(gamma=0.5, **{"config/optim.warmup_frac": 0.05}).to_parquet(w / "results.parquet")
    with pytest.raises(SystemExit, match=r"warmup_steps=\['409'\] is not the crossover baseline's \['102'\]"):
        main(["--crossover", str(c), "--widths", str(w)])
    # The same 102 warmup steps from a smaller largest budget (registry_widths beside crossover_registry) pair.
    table.assign(gamma=0.5, **{"config/optim.warmup_frac": 0.025, "config/train.budgets": "[2097152, 4194304]"}
                 ).to_parquet(w / "results.parquet")
    main(["--crossover", str(c), "--widths", str(w)])
    table.assign(gamma=0.5).drop(columns="config/train.eval_tokens").to_parquet(w / "results.parquet")
    with pytest.raises(SystemExit, match="eval_tokens is not in both"):
        main(["--crossover", str(c), "--widths", str(w)])


def test_without_the_widths_the_page_says_nothing_was_read(tmp_path, capsys):
    c, _ = sweeps(tmp_path)
    assert main(["--crossover", str(c)]) == 0
    assert "not measured yet" in capsys.readouterr().out


def test_scaling_laws_recorded_cells_are_the_recipes_twelve_and_the_baselines_four():
    summary = json.loads((Path(__file__).parents[1] / "docs/results/scaling_law/summary.json").read_text())
    cells = scaling_law_cells(summary)
    assert (cells["arm"] == "recipe").sum() == 12 and (cells["arm"] == "baseline").sum() == 4
    base = cells[cells["arm"] == "baseline"].sort_values("n")
    assert base["d"].nunique() == 1 and base["loss"].round(4).tolist() == [5.1777, 5.2008, 5.0942, 5.0722]
    # The baseline's own count (no gate) is below the recipe's at each width.
    assert (base["n"].to_numpy() < cells[(cells["arm"] == "recipe") & (cells["d"] == base["d"].iloc[0])]
            .sort_values("n")["n"].to_numpy()).all()


def test_scaling_law_alone_appends_its_refit_to_a_records_checks(tmp_path, capsys):
    from records import write_record

    checks = tmp_path / "checks.md"
    write_record(checks, "the WSD check's table\n", "records.wsd_check")  # another check wrote it first
    summary = str(Path(__file__).parents[1] / "docs/results/scaling_law/summary.json")
    assert main(["--scaling-law", summary, "--out", str(checks), "--append"]) == 0
    text = checks.read_text()
    assert text.startswith("the WSD check's table\n\n**scaling_law's recorded cells, refitted jointly**")
    assert "12 recipe cells (4 widths x 3 budgets) and 4 baseline cells" in text and text.count("| held |") == 4
    # The rms misses are read against the seed spread the summary keeps (the largest budget's cells).
    assert "Seed sd per cell (median [range]): baseline 0.0114 [0.0027, 0.0141] over 4 of 4 cells; recipe" in text
    with pytest.raises(SystemExit):
        main(["--widths", str(tmp_path)])
