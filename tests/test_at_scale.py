"""CAPOTrainer the way a multi-GPU run uses it, on two CPU processes over gloo: DeepSpeed ZeRO-2 and ZeRO-3
(its CPU accelerator), TRL's vLLM branch (through ``vllm_standin.py``), a PEFT adapter, an in-memory model,
row-selecting reference scoring, and a checkpoint resumed on another number of processes.

TRL's vLLM branch with the stand-in samples the same completions for the same global batch on any
number of processes, so a 2-process run is compared with a 1-process run of the same global batch
(the data sampler is global too): the only difference left is the order of float reductions.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import deepspeed  # noqa: F401  -- a test dependency (pip install -e ".[test]"): the runs below need it
import pytest
from test_distributed import free_port

HERE = Path(__file__).resolve().parent
ACCELERATE = HERE.parent / "examples" / "accelerate"
# dr_grpo's normaliser ignores dropped rows, so ref_scoring="auto" scores only rows with an advantage:
# each process selects a different number of rows, which is what hung ZeRO-3. Thresholds inside the
# reference PPL range of the random tiny model (~76-82), so the mask drops some completions.
SHARED = {"loss_type": "dr_grpo", "ref_high": 81.0, "ref_low": 77.0, "max_steps": 2}
AUTO = {"loss_type": "dr_grpo", "ref_thresholds": "auto", "max_steps": 3}
# Loss and gradient norm go through a different order of float reductions on 2 processes: measured
# differences are ~1e-7 relative (fp32); rewards, masks and thresholds are discrete or computed from the
# same numbers, and must be equal.
RTOL = 1e-4
SAME = ("reward", "reward_std", "frac_reward_zero_std", "capo/kept_frac", "capo/dropped_correct",
        "capo/dropped_wrong", "capo/mixed_group_frac", "capo/ref_high", "capo/ref_low", "num_tokens")
CLOSE = ("loss", "grad_norm", "capo/adv_abs_mean", "capo/ref_ppl_mean", "capo/score_spread", "entropy")


def launch(tmp_path, name, processes, spec, zero=None):
    """``accelerate launch`` of at_scale.py; returns its JSON result."""
    result = tmp_path / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu"}
    if zero is not None:  # the shipped recipes' accelerate configs, with the process count and precision of a CPU
        how = ["--config_file", str(ACCELERATE / f"zero{zero}.yaml")]
    else:
        how = ["--multi_gpu"] if processes > 1 else ["--cpu"]  # --multi_gpu without a GPU: gloo on the CPU
        how += ["--num_machines", "1", "--dynamo_backend", "no"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *how, "--num_processes", str(processes),
           "--mixed_precision", "no", "--main_process_port", str(free_port()), str(HERE / "at_scale.py"),
           json.dumps({"out": str(tmp_path / name), **spec}), str(result)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(result.read_text())


def steps(result):
    return [r for r in result["rows"] if "loss" in r]


def assert_same_run(a, b, n_steps):
    rows_a, rows_b = steps(a)[:n_steps], steps(b)[:n_steps]
    assert len(rows_a) == len(rows_b) == n_steps
    for step, (ra, rb) in enumerate(zip(rows_a, rows_b), start=1):
        for key in SAME:
            if key in ra or key in rb:
                assert ra.get(key) == rb.get(key), (step, key, ra.get(key), rb.get(key))
        for key in CLOSE:
            if key == "entropy" and (ra.get("capo/skipped_frac") or rb.get("capo/skipped_frac")):
                continue  # with rows skipped it is the forwarded rows' entropy, which depends on how rows split
            if ra.get(key) is None or rb.get(key) is None:  # undefined on this batch (e.g. no mixed group)
                assert ra.get(key) == rb.get(key), (step, key)
            else:
                assert ra[key] == pytest.approx(rb[key], rel=RTOL, abs=1e-6), (step, key, ra[key], rb[key])


STALE_LOCK_SECONDS = 900  # DeepSpeed's CPU shm op compiles in ~2 min of CPU; a lock this old has no compiler behind it


@pytest.fixture(scope="module", autouse=True)
def no_stale_extension_lock():
    """A ZeRO launch killed while DeepSpeed compiled its CPU shm op leaves torch's build lock behind, and every
    later launch waits on it until its deadline: say so at once, with the fix, instead of failing each test late."""
    import time

    from torch.utils.cpp_extension import get_default_build_root

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    stale = [lock for lock in root.glob("*/deepspeed_shm_comm/lock")
             if time.time() - lock.stat().st_mtime > STALE_LOCK_SECONDS]
    if stale:
        pytest.fail(f"{stale[0]} is a stale build lock (a DeepSpeed run was killed while compiling); "
                    "delete it and rerun.")


@pytest.fixture(scope="module")
def single(tiny_model_dir, tmp_path_factory):
    """One process, no DeepSpeed, the same global batch (8 completions a step)."""
    spec = {"model_dir": tiny_model_dir, "vllm": True, "config": {**SHARED, "per_device_train_batch_size": 8}}
    return launch(tmp_path_factory.mktemp("single"), "run", 1, spec), None


@pytest.fixture(scope="module")
def single_auto(tiny_model_dir, tmp_path_factory):
    """As ``single``, thresholds measured (ref_thresholds="auto"), 3 steps and a checkpoint at step 2."""
    tmp = tmp_path_factory.mktemp("single-auto")
    spec = {"model_dir": tiny_model_dir, "vllm": True,
            "config": {**AUTO, "per_device_train_batch_size": 8, "save_strategy": "steps", "save_steps": 2}}
    return launch(tmp, "run", 1, spec), tmp / "run"


@pytest.mark.slow
@pytest.mark.parametrize("zero, model", [(2, "path"), (3, "memory")])
def test_zero_two_processes_equal_one(tiny_model_dir, tmp_path, single, zero, model):
    """ZeRO-2 from a path and ZeRO-3 from a model loaded (and so partitioned) before the trainer was built."""
    result = launch(tmp_path, f"zero{zero}", 2, {"model_dir": tiny_model_dir, "vllm": True, "model": model,
                                                   "config": SHARED}, zero=zero)
    assert result["distributed_type"] == "DistributedType.DEEPSPEED" and result["zero3"] == (zero == 3)
    assert result["own_reference"] and result["ref_scoring"] == "needed"
    assert_same_run(result, single[0], 2)
    scored = [r["capo/ref_scored_frac"] for r in steps(result) if "capo/ref_scored_frac" in r]  # after measuring
    assert scored and min(scored) < 1.0  # rows were selected, differently per process ...
    first, second = (p["forwards"] for p in result["processes"])
    if zero == 3:
        assert len(first) == len(second) and first == second  # ... yet every process ran the same forwards
    assert any(r["capo/kept_frac"] < 1.0 for r in steps(result))  # the mask dropped completions


@pytest.mark.slow
def test_zero3_with_a_lora_adapter(tiny_model_dir, tmp_path):
    result = launch(tmp_path, "peft", 2, {"model_dir": tiny_model_dir, "vllm": True, "peft": True,
                                           "config": SHARED}, zero=3)
    assert result["zero3"] and not result["own_reference"] and result["global_step"] == 2
    first, second = (p["forwards"] for p in result["processes"])
    assert first == second and first  # reference forwards (adapter disabled) in lockstep
    assert steps(result)[-1]["grad_norm"] > 0


@pytest.mark.slow
def test_resume_on_another_number_of_processes_equals_not_stopping(tiny_model_dir, tmp_path, single_auto):
    """A 1-process checkpoint resumed on 2 processes: the same thresholds on both, and step 3 as unbroken."""
    unbroken, run = single_auto
    shutil.copytree(run / "checkpoint-2", tmp_path / "resumed" / "checkpoint-2")
    spec = {"model_dir": tiny_model_dir, "vllm": True, "resume": True,
            "config": {**AUTO, "per_device_train_batch_size": 4}}
    result = launch(tmp_path, "resumed", 2, spec)
    assert result["num_processes"] == 2 and result["global_step"] == 3
    saved = tuple(unbroken["processes"][0]["thresholds"])
    assert len(saved) == 2  # measured before the checkpoint, so carried by it
    assert all(tuple(p["thresholds"]) == saved for p in result["processes"])
    assert_same_run(result, unbroken, 3)  # steps 1-2 from the checkpoint's log, step 3 trained on 2 processes


@pytest.mark.slow
def test_zero3_skipping_rows_on_one_process_only(tiny_model_dir, tmp_path):
    """Process 0's group ties (its rows skippable), process 1's does not: each still runs one loss forward per
    micro-batch, and the weights equal a run that forwards every row (SGD: they differ only by float sums)."""
    config = {"noise_mask": False, "optim": "sgd", "learning_rate": 5e-2}
    runs = {skip: launch(tmp_path, f"skip-{skip}", 2, {"model_dir": tiny_model_dir, "vllm": True,
                                                       "reward": "tied_on_rank_zero",
                                                       "config": {**config, "skip_zero_advantage_rows": skip}},
                         zero=3)
            for skip in (False, True)}
    first, second = (p["loss_forwards"] for p in runs[True]["processes"])
    assert len(first) == len(second) == 2  # one loss forward a step on each process, in lockstep
    assert first == [1, 1] and second == [4, 4]  # process 0 forwarded the one row it keeps, process 1 all four
    assert all(p["loss_forwards"] == [4, 4] for p in runs[False]["processes"])
    assert [r["capo/skipped_frac"] for r in steps(runs[True])] == [3 / 8, 3 / 8]
    assert runs[True]["checksum"] == pytest.approx(runs[False]["checksum"], rel=1e-6)
    assert [r["loss"] for r in steps(runs[True])] == pytest.approx([r["loss"] for r in steps(runs[False])], rel=1e-4)


def test_the_inference_only_shm_op_is_not_compiled():
    """at_scale.py skips DeepSpeed's CPU shared-memory all-reduce op: compiling it was ~2.5 min of the first ZeRO test
    in every new environment, and ZeRO training never calls it (only inference_all_reduce does)."""
    import importlib

    from capo_trl.testing.deepspeed_cpu import skip_shm_comm_op

    comm = importlib.import_module("deepspeed.comm.torch")
    skip_shm_comm_op()
    assert comm.build_shm_op() is None  # without the skip: a compile (minutes), then the op's module
