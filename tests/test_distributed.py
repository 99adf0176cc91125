"""Two CPU processes under `accelerate launch` (gloo): gathering, slicing and masking stay aligned."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_group_split_across_processes_matches_single_process(tiny_model_dir, tmp_path):
    result = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    # `--cpu` makes accelerate's simple launcher start ONE process; `--multi_gpu` on a machine without a GPU
    # starts two torch.distributed processes that fall back to gloo on the CPU (DistributedType.MULTI_CPU).
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--main_process_port", str(free_port()),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           str(HERE / "dist_check.py"), tiny_model_dir, str(tmp_path / "out"), str(result)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(result.read_text())
    assert data["num_processes"] == 2 and len(data["checks"]) == 3
    for check in data["checks"]:
        assert check["group_spans_processes"] and check["items_match"]
        assert check["max_abs_diff"] < 1e-6
    assert any(c["nonzero"] for c in data["checks"])  # at least one step had a learning signal to compare
