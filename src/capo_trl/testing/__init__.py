"""Helpers for tests, benchmarks and users' own tests (in the spirit of ``transformers.testing_utils``):
a tiny offline model, tokenizer and dataset (:mod:`~capo_trl.testing.tiny`), the grouped-data model
of selective answering (:mod:`~capo_trl.testing.selective_sim`), and grading workloads built from
benchmark gold answers (:mod:`~capo_trl.testing.reward_workloads`). Nothing else in the package
imports them."""
