"""A recipe written for `trl grpo` (tests/data/trl_grpo_recipe.yaml) runs unchanged under `capo-trl train`,
and under TRL's own script, offline on a CPU with the tiny test model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from capo_trl.cli import train as capo_train

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "tests" / "data" / "trl_grpo_recipe.yaml"


def overrides(model: str, out: Path) -> list[str]:
    return ["--config", str(RECIPE), "--model_name_or_path", model, "--output_dir", str(out),
            "--dataset_name", str(ROOT / "tests" / "data" / "trl_recipe")]


def test_the_recipe_uses_only_trl_grpo_fields():
    from trl.scripts.grpo import make_parser

    parser = make_parser()
    known = {action.dest for action in parser._actions}
    assert set(yaml.safe_load(RECIPE.read_text())) <= known


def test_trl_grpo_recipe_trains_under_capo_trl(tiny_model_dir, tmp_path):
    trainer = capo_train.main(overrides(tiny_model_dir, tmp_path / "out"))
    assert trainer.state.global_step == 2 and (tmp_path / "out" / "config.json").is_file()
    assert trainer.reward_func_names == ["accuracy_reward"]  # TRL's function, by its short name
    row = trainer.train_dataset[0]
    assert isinstance(row["prompt"], list) and row["prompt"][0]["role"] == "user"  # used as is
    assert {"solution", "source"} <= set(trainer.train_dataset.column_names)  # passed to the rewards
    assert any("rewards/accuracy_reward/mean" in r for r in trainer.state.log_history)


def test_trl_grpo_recipe_trains_under_trls_own_script(tiny_model_dir, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "trl.scripts.grpo", *overrides(tiny_model_dir, tmp_path / "trl")],
                          check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "math_verify" in proc.stderr:
        pytest.skip("TRL's accuracy_reward needs math_verify")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "trl" / "config.json").is_file() and "'rewards/accuracy_reward/mean'" in proc.stdout
