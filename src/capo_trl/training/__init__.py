"""Training: ``CAPOTrainer`` (TRL's ``GRPOTrainer`` plus the method boundary), ``CAPOConfig``, the
mask's and the reference's per-run state, scoring, checkpointed state, the ``capo/*`` metrics and the
checks at construction. Public names are re-exported by :mod:`capo_trl`."""
