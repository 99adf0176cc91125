"""What a TRL user expects of a drop-in: GRPOTrainer's typed constructor, a model card that credits CAPO,
``python -m capo_trl``, type information, one version."""

import inspect
import subprocess
import tomllib
import sys
from pathlib import Path

from capo_trl.testing.tiny import digit_reward, tiny_dataset
from trl import GRPOTrainer

import capo_trl
from capo_trl import CAPOConfig, CAPOTrainer

ROOT = Path(__file__).resolve().parents[1]


def test_constructor_has_grpotrainers_parameters_and_defaults():
    ours, theirs = (inspect.signature(cls.__init__).parameters for cls in (CAPOTrainer, GRPOTrainer))
    assert list(ours) == list(theirs)
    assert all(ours[name].default == theirs[name].default for name in theirs)
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for name, p in ours.items())  # no *args / **kwargs hiding them


def test_model_card_names_and_cites_capo_with_its_settings(tiny_model_dir, tmp_path):
    args = CAPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_steps=1,
                      max_completion_length=4, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                      tau=0.4, noise_mask=True, ref_high=3.0)
    trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.create_model_card(model_name="tiny-capo")
    card = (tmp_path / "README.md").read_text()
    assert "trained with CAPO, a method introduced in [Calibration-Aware Policy Optimization" in card
    assert "2604.12632" in card and "@inproceedings{wang2026capo" in card
    assert "DeepSeekMath" not in card
    assert "- capo" in card and "- trl" in card and "- grpo" in card  # TRL's tags kept
    assert "| `tau` | `0.4` |" in card and "| `ref_high` | `3.0` |" in card and "| `noise_mask` | `True` |" in card


def test_python_dash_m_typed_package_and_one_version():
    out = subprocess.run([sys.executable, "-m", "capo_trl", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"capo-trl {capo_trl.__version__}"
    assert (Path(capo_trl.__file__).parent / "py.typed").is_file()
    pyproject = (ROOT / "pyproject.toml").read_text()
    project = tomllib.loads(pyproject)["project"]
    assert "version" in project["dynamic"] and "version" not in project and capo_trl.__version__ not in pyproject
    assert capo_trl.CalibrationCallback.__module__ == "capo_trl.evaluation.callbacks"


def test_multi_objective_aggregation_is_honoured_or_refused(tiny_model_dir, tmp_path):
    import pytest
    import torch

    base = dict(use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=8, num_generations=4,
                max_steps=1, max_completion_length=6, save_strategy="no", seed=1, logging_steps=1)
    for name in ("capo", "dr_grpo", "cde", "c2gspg", "rlcr", "dcpo"):
        with pytest.raises(ValueError, match=f"multi_objective_aggregation='normalize_then_sum' is not honoured "
                                             f"by advantage_estimator='{name}'"):
            CAPOConfig(output_dir=str(tmp_path), advantage_estimator=name,
                       multi_objective_aggregation="normalize_then_sum", **base)

    def length_reward(completions, **kwargs):
        return [len(c) / 8.0 for c in completions]

    seen = {}
    for label, cls, config_cls in (("trl", GRPOTrainer, None), ("capo", CAPOTrainer, CAPOConfig)):
        from trl import GRPOConfig

        args = (config_cls or GRPOConfig)(output_dir=str(tmp_path / label), multi_objective_aggregation=
                                          "normalize_then_sum", **({"advantage_estimator": "grpo"} if config_cls
                                                                  else {}), **base)
        trainer = cls(model=tiny_model_dir, reward_funcs=[digit_reward, length_reward], args=args,
                      train_dataset=tiny_dataset())
        original = trainer._generate_and_score_completions

        def spy(inputs, original=original, label=label):
            out = original(inputs)
            seen[label] = out["advantages"].clone()
            return out

        trainer._generate_and_score_completions = spy
        torch.manual_seed(0)
        trainer.train()
    torch.testing.assert_close(seen["capo"], seen["trl"])  # TRL's own normalize-then-sum advantages
