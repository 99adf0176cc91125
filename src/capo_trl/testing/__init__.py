"""Helpers for tests, benchmarks and users' own tests (in the spirit of ``transformers.testing_utils``):
a tiny offline model, tokenizer and dataset (:mod:`~capo_trl.testing.tiny`), the grouped-data model
of selective answering (:mod:`~capo_trl.testing.selective_sim`), grading workloads built from
benchmark gold answers (:mod:`~capo_trl.testing.reward_workloads`), and DeepSpeed on a CPU without
its inference-only compiled op (:mod:`~capo_trl.testing.deepspeed_cpu`). Nothing else in the package
imports them."""
