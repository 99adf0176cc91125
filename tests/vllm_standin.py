"""A stand-in for TRL's vLLM engine (``trl.trainer.grpo_trainer.VLLMGeneration``) that samples with transformers.

Installed before a trainer is built, it lets TRL's own vLLM branch of ``GRPOTrainer`` run on a CPU:
``_generate_single_turn``'s vLLM path, the importance-sampling correction against the returned
log-probs, weight syncs at each step, server mode's gather / main-process generation / broadcast.

What it does not cover: vLLM itself (its sampler, its log-prob numerics, which differ from a
transformers forward by bf16 noise; paged attention; sleep mode; tensor parallelism), the HTTP client
of server mode and its NCCL weight broadcast (``sync_weights`` here only counts calls: the engine
samples from the live training model, as a perfectly synced vLLM would).

Sampling is seeded by the prompt's token ids, its global row and the step, not by the process, so the same global
batch gets the same completions on any number of processes (a 2-process run can be compared with a
1-process run exactly).
"""

from __future__ import annotations

import hashlib

import torch
from accelerate.utils import broadcast_object_list, gather_object


class StandInVLLMGeneration:
    instances: list[StandInVLLMGeneration] = []

    def __init__(self, model, accelerator, processing_class, mode="colocate", temperature=1.0, top_p=1.0, top_k=0,
                 min_p=0.0, repetition_penalty=1.0, max_completion_length=16, logprobs=0, generation_kwargs=None,
                 **_unused):
        self.model, self.accelerator, self.mode = model, accelerator, mode
        tokenizer = getattr(processing_class, "tokenizer", processing_class)
        self.pad_id, self.eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
        self.temperature, self.max_completion_length = temperature, max_completion_length
        if (top_p, top_k or 0, min_p or 0.0, repetition_penalty) != (1.0, 0, 0.0, 1.0):
            raise NotImplementedError("the stand-in samples from the plain softmax(logits / T) only")
        self.syncs, self.calls = 0, 0
        self.step_of = None  # set to ``lambda: trainer.state.global_step`` to seed by step (then resuming matches)
        self.vllm_client = self  # server mode asks the client for its log-prob mode
        StandInVLLMGeneration.instances.append(self)

    def get_server_info(self):
        return {"model_config": {"logprobs_mode": "processed_logprobs"}}

    def sync_weights(self):
        self.syncs += 1

    @torch.no_grad()
    def _sample(self, prompts: list[list[int]], first_row: int):
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()
        completions, logprobs = [], []
        for row, ids in enumerate(prompts, start=first_row):  # the global row: a group's copies differ
            step = self.calls if self.step_of is None else self.step_of()
            digest = hashlib.blake2b(repr((ids, row, step)).encode(), digest_size=8).digest()
            generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") % 2**62)
            seq, lps, done = list(ids), [], False
            # always max_completion_length forwards per prompt: under ZeRO-3 every forward is a collective, and
            # every process must run as many as the others (tokens after the EOS are discarded)
            for _ in range(self.max_completion_length):
                logits = model(torch.tensor([seq], device=next(model.parameters()).device)).logits[0, -1].float()
                logp = torch.log_softmax(logits.cpu() / self.temperature, dim=-1)
                token = int(torch.multinomial(logp.exp(), 1, generator=generator))
                seq.append(token)
                if not done:
                    lps.append([float(logp[token])])
                done = done or token == self.eos_id
            completions.append(seq[len(ids):len(ids) + len(lps)])
            logprobs.append(lps)
        model.train(was_training)
        return completions, logprobs

    def generate(self, prompts, images, num_generations, profiler=None):
        if self.mode == "server":  # as TRL's client: the main process generates for everyone, then broadcasts
            everyone = gather_object(prompts)
            payload = [self._sample(everyone, 0) if self.accelerator.is_main_process else None]
            broadcast_object_list(payload, from_process=0)
            completions, logprobs = payload[0]
            local = slice(self.accelerator.process_index * len(prompts),
                          (self.accelerator.process_index + 1) * len(prompts))
            completions, logprobs = completions[local], logprobs[local]
        else:
            completions, logprobs = self._sample(prompts, self.accelerator.process_index * len(prompts))
        self.calls += 1
        token_ids = [[[t] for t in c] for c in completions]
        return prompts, completions, logprobs, token_ids


def install(monkeypatch=None):
    """Replace TRL's engine with the stand-in (through ``monkeypatch`` in a test, else for the process)."""
    import trl.trainer.grpo_trainer as grpo

    if monkeypatch is not None:
        monkeypatch.setattr(grpo, "VLLMGeneration", StandInVLLMGeneration)
    else:
        grpo.VLLMGeneration = StandInVLLMGeneration
