"""DeepSpeed on its CPU accelerator, for tests and CPU smoke runs: without its shared-memory all-reduce op.

Why: DeepSpeed's CPU backend compiles that op (C++, OpenMP) the first time any process initialises
``deepspeed.comm``, and recompiles it whenever the build's paths change (another virtual environment,
a fresh clone): about 2.5 minutes of CPU, once per environment, in the first test that launches ZeRO.
The op serves only ``inference_all_reduce`` (DeepSpeed-Inference's tensor parallelism); ZeRO training
reduces through ``torch.distributed`` either way, and a GPU run uses the CUDA accelerator, which has
no such op. So leaving it out changes nothing these runs check.
"""

from __future__ import annotations

SHM_OP = "deepspeed_shm_comm"


def skip_shm_comm_op() -> None:
    """Mark the op incompatible before ``deepspeed.comm`` initialises: ``build_shm_op`` then returns None."""
    import deepspeed.ops

    compatible = deepspeed.ops.__compatible_ops__  # probed on first access, then kept for the process
    if SHM_OP not in compatible:
        raise RuntimeError(f"DeepSpeed {deepspeed.__version__} has no {SHM_OP!r} op to skip: "
                           "capo_trl.testing.deepspeed_cpu needs updating for this version.")
    compatible[SHM_OP] = False


__all__ = ["skip_shm_comm_op"]
