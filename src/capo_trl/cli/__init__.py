"""The ``capo-trl`` command: the dispatcher (:mod:`~capo_trl.cli.main`), ``capo-trl train``'s
arguments and run, and reward functions by name."""
