"""Run under `torchrun --nproc_per_node 2` (gloo, CPU): CAPO's FSDP2 reference is sharded one decoder block
at a time, and its reference forwards stay collective when the processes want different rows.

accelerate enables FSDP only on GPU-like devices, so this drives torch's ``fully_shard`` directly with the
two pieces ``build_reference`` uses under FSDP2: ``shard_blocks`` (then the root, as TRL's ``prepare_fsdp``
does) and ``collective_rows``. Writes a JSON verdict from rank 0.
"""

import faulthandler
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from transformers import AutoModelForCausalLM

from capo_trl.training.reference import shard_blocks
from capo_trl.training.scoring import collective_rows

faulthandler.dump_traceback_later(120, exit=True)  # a forward one process never runs hangs the other: fail
model_dir, result_path = sys.argv[1:3]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
plain = AutoModelForCausalLM.from_pretrained(model_dir).eval()
ref = AutoModelForCausalLM.from_pretrained(model_dir).eval()
blocks = shard_blocks(ref, mesh=mesh, reshard_after_forward=True)
fully_shard(ref, mesh=mesh)
layer = ref.model.layers[0]
local = sum(p.to_local().numel() for p in layer.parameters())
total = sum(p.numel() for p in layer.parameters())

torch.manual_seed(0)  # the same batch on every process; each wants a different number of its rows
ids = torch.randint(3, plain.config.vocab_size, (6, 10))
want = torch.zeros(6, dtype=torch.bool)
want[: 3 if rank == 0 else 0] = True
counts = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
dist.all_gather(counts, torch.tensor([int(want.sum())]))
rows = collective_rows(want, torch.cat(counts))
forwards, diffs = 0, []
with torch.no_grad():
    for chunk in rows.nonzero().squeeze(1).split(2):  # TRL's log-prob loop: one forward per batch_size rows
        logits = ref(ids[chunk]).logits
        forwards += 1
        diffs.append((logits - plain(ids[chunk]).logits).abs().max().item())
everyone = [None] * world
dist.all_gather_object(everyone, {"forwards": forwards, "max_abs_diff": max(diffs, default=0.0),
                                  "wanted": int(want.sum()), "scored": int(rows.sum())})
if rank == 0:
    with open(result_path, "w") as f:
        json.dump({"blocks": blocks, "layer_local_numel": local, "layer_numel": total,
                   "blocks_are_units": all(isinstance(m, FSDPModule) for m in ref.model.layers),
                   "processes": everyone}, f)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # skip interpreter teardown: gloo threads holding tensors at finalization can abort a rank (SIGABRT)
