"""The math grader: math-verify in killable worker processes, with gold-answer fixes.

Layers, each importing only those before it: ``normalize`` (pure string work), ``worker`` (what runs
in a worker), ``fast`` (exact shortcuts in the parent), ``pool`` (the watched worker pool),
``memory`` (golds and verdicts remembered across calls), ``call`` (one grading call: grouping,
deduplication, probes), ``grader`` (:class:`MathGrader`: the API; :func:`default_grader`: one
shared instance per process). TRL reward functions over it are in :mod:`capo_trl.rewards`.

Why workers: math-verify's timeouts use ``signal.alarm`` (main thread only) and cannot interrupt C
code (huge integer powers, ``str()`` of some sympy objects), so inputs such as ``9^{9^{9^{9}}}``
hang a training run. Every item runs in a pebble worker with a hard deadline enforced by the
parent; an overrunning worker is killed and replaced, and only that item scores 0.0.

Why the parent never waits without a deadline: a worker killed at the wrong moment (by the OOM
killer, say) while pebble hands it a task loses that task (pebble's own timeout only starts once a
worker acknowledges it) or wedges the pool (a dead worker holding the channel lock, half a message
in a pipe). The parent watches its pool: tasks pending with no worker running any of them, or no
task finishing for longer than one item may take, mean the pool is wedged; it is then stopped and
rebuilt and the unfinished items are retried once. Every call also has a hard overall deadline
(:meth:`MathGrader.batch_time_limit`).

Why fork (the default on Linux): the parent imports math-verify once and forked workers inherit
it, so a replacement worker is ready in milliseconds; with ``spawn``/``forkserver`` each worker
re-imports sympy and the caller's package (~1 s, several seconds if torch is pulled in). Workers
never touch torch, so torch's OpenMP/CUDA state in the parent is not an issue. Pass
``mp_context="forkserver"`` if your process forks badly (e.g. threads holding C-level locks).
"""
from .grader import MathGrader, default_grader
from .normalize import as_text, last_boxed

__all__ = ["MathGrader", "default_grader", "as_text", "last_boxed"]
