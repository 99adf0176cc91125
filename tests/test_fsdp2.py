"""FSDP2 on two CPU processes (torchrun, gloo): CAPO's reference is sharded per decoder block, and reference
forwards stay collective when the processes want different rows (``fsdp2_check.py``).

accelerate enables FSDP only on GPU-like devices, so CAPOTrainer itself does not run under FSDP here: this
covers the two pieces its FSDP2 reference is built from, not accelerate's or TRL's FSDP wrapping."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_distributed import free_port

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_fsdp2_reference_is_sharded_per_block_and_its_forwards_stay_collective(tiny_model_dir, tmp_path):
    result = tmp_path / "fsdp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(HERE / "fsdp2_check.py"), tiny_model_dir, str(result)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(result.read_text())
    assert data["blocks"] == 2 and data["blocks_are_units"]  # one FSDP unit per decoder layer, not one for the model
    assert data["layer_local_numel"] * 2 == data["layer_numel"]  # each process holds half of each block
    first, second = data["processes"]
    assert (first["wanted"], second["wanted"]) == (3, 0)
    assert first["forwards"] == second["forwards"] == 2  # the process that wants nothing still runs both forwards
    assert first["max_abs_diff"] < 1e-5  # the sharded reference computes what the unsharded model does
