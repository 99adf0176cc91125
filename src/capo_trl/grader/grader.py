"""The grading API: grade completions against gold answers, compare two answers, extract one; with caches."""

from __future__ import annotations

import atexit
import logging
import math
import multiprocessing
import os
import sys
import threading
import weakref
from collections import OrderedDict

from .normalize import as_text, _balanced, _gold_key, _gold_latex
from .pool import _STOP_WAIT, _Batch, _default_workers, _is_int, _Workers
from .tasks import (
    _GRACE,
    CORRECT,
    DIED,
    GOLD_BAD,
    GOLD_TIMEOUT,
    KILLED,
    OOM,
    PRED_BAD,
    TIMED_OUT,
    WRONG,
    _configs,
    _equiv_task,
    _extract_task,
    _grade_task,
)

logger = logging.getLogger("capo_trl.grader")

_LIVE: weakref.WeakSet[MathGrader] = weakref.WeakSet()

@atexit.register
def _close_all() -> None:
    for reward in list(_LIVE):
        reward.close()



class MathGrader:
    """Grades final answers with math-verify in worker processes; :mod:`capo_trl.rewards` wraps it for TRL.

    Args:
        timeout: hard per-item deadline in whole seconds (math-verify only honours ints >= 1).
        workers: worker processes (default: usable CPUs / processes on this node, at most 8).
        mp_context: ``"fork"`` (default on Linux), ``"forkserver"`` or ``"spawn"``.
        memory_limit_mb: address space (MiB) each worker may add to what it inherits at start
            (``RLIMIT_AS``); an item that needs more scores 0.0 as ``out_of_memory``. ``None``: no cap.
        max_gold_chars: a gold answer longer than this is unparseable by rule (``None``: no limit).

    Deadlines: an item is killed at ``timeout + 0.5`` s. A worker that dies under an item (OOM
    killer, segfault) gets the item retried once; a pool that wedges (a task lost by pebble: pending
    with no worker running any task for 1 s; or no task finishing for ``timeout + 1.5`` s) is
    stopped and rebuilt and its unfinished items retried once. An item that fails again scores 0.0
    (``worker_died``). Whatever happens, a call on ``n`` items returns within
    ``batch_time_limit(n) = 2 * (ceil(n / workers) + 3) * (timeout + 1.5) + 10`` seconds (with
    ``fork``; ``timeout + 20.5`` per slot with ``spawn``/``forkserver``, whose workers start slowly).
    """

    _STAT_KEYS = ("graded", "correct", "gold_unparseable", "pred_unparseable", "timed_out", "worker_died",
                  "out_of_memory")  # fmt: skip

    def __init__(
        self,
        timeout: int = 5,
        workers: int | None = None,
        mp_context: str | None = None,
        memory_limit_mb: int | None = 4096,
        max_gold_chars: int | None = 2000,
    ):
        if not _is_int(timeout, 1):
            raise ValueError(f"timeout must be an integer number of seconds >= 1, got {timeout!r}")
        if workers is not None and not _is_int(workers, 1):
            raise ValueError(f"workers must be a positive integer or None, got {workers!r}")
        if mp_context is None:
            mp_context = "fork" if sys.platform.startswith("linux") else "spawn"
        if mp_context not in multiprocessing.get_all_start_methods():
            raise ValueError(f"mp_context must be one of {multiprocessing.get_all_start_methods()}, got {mp_context!r}")
        if memory_limit_mb is not None and not _is_int(memory_limit_mb, 64):
            raise ValueError(f"memory_limit_mb must be an integer >= 64 (MiB) or None, got {memory_limit_mb!r}")
        if max_gold_chars is not None and not _is_int(max_gold_chars, 1):
            raise ValueError(f"max_gold_chars must be a positive integer or None, got {max_gold_chars!r}")
        self.timeout, self.workers, self.mp_context = timeout, workers or _default_workers(), mp_context
        self.memory_limit_mb, self.max_gold_chars = memory_limit_mb, max_gold_chars
        self._lock = threading.Lock()
        self._pool: _Workers | None = None
        self._stats = dict.fromkeys(self._STAT_KEYS, 0)
        self._gold_cache: OrderedDict[tuple[str, ...], tuple[tuple[str, ...], str | None]] = OrderedDict()
        self._bad_golds: OrderedDict[tuple[str, ...], None] = OrderedDict()
        self._good_golds: OrderedDict[tuple[str, ...], None] = OrderedDict()
        self._equiv_cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        _LIVE.add(self)

    # ---- deadlines ------------------------------------------------------------------------

    @property
    def _slot(self) -> float:
        """Longest one task can hold a worker: deadline + pebble's polling, the kill, a fresh worker."""
        return self.timeout + _GRACE + (1.0 if self.mp_context == "fork" else 20.0)

    @property
    def _idle(self) -> float:
        return 1.0 if self.mp_context == "fork" else self._slot

    def batch_time_limit(self, n: int) -> float:
        """Seconds within which a call on ``n`` items returns, whatever the workers do.

        Two rounds (the second after a wedged pool is rebuilt) of ``ceil(n / workers) + 3`` task
        slots (3: a gold probe, its gold-only check and its other completions run in sequence), plus
        ``2 * 5`` s to stop pools. Work still unfinished then is abandoned and scores 0.0.
        """
        return 2 * (math.ceil(n / self.workers) + 3) * self._slot + 2 * _STOP_WAIT

    # ---- lifecycle ------------------------------------------------------------------------

    def _get_pool(self) -> _Workers:
        with self._lock:
            old = self._pool
            if old is not None and old.pid == os.getpid() and not old.closed and old.pool.active:
                return old
            _configs()  # import math-verify before forking, so (re)started workers inherit it
            from math_verify.parser import get_extraction_regexes

            get_extraction_regexes(_configs()[1])  # compile math-verify's big regexes pre-fork
            self._pool = _Workers(self.workers, self.mp_context, self.memory_limit_mb)
            new = self._pool
        if old is not None:
            old.shutdown(wait=0)  # broken, or a forked child's copy of the parent's pool (then a no-op)
        return new

    def _discard(self, workers: _Workers, why: str) -> None:
        """Stop a wedged pool (bounded); the next task starts a fresh one."""
        with self._lock:
            if self._pool is workers:
                self._pool = None
        if not workers.closed:
            logger.warning("math reward: restarting the worker pool (%s); unfinished items are retried", why)
        workers.shutdown(wait=0)  # workers killed now; pebble's threads wind down in the background

    def _worker_pids(self) -> list[int]:
        """PIDs of the current pool's workers (tests, diagnostics)."""
        with self._lock:
            workers = self._pool
        return [p.pid for p in workers.processes()] if workers is not None else []

    def close(self) -> None:
        """Stop the worker processes within a few seconds (idempotent). A later call restarts them."""
        with self._lock:
            workers, self._pool = self._pool, None
        if workers is not None:
            workers.shutdown()

    def __enter__(self) -> MathGrader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self):  # picklable (e.g. copied into another process): without the pool
        state = self.__dict__.copy()
        state.update(_lock=None, _pool=None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()
        _LIVE.add(self)

    @property
    def stats(self) -> dict[str, int]:
        """Cumulative counters since creation (a copy)."""
        with self._lock:
            return dict(self._stats)

    # ---- running tasks ----------------------------------------------------------------------

    def _run(self, fn, arglists: list[tuple], held=(), on_done=None) -> list:
        """Run ``fn(*args, timeout)`` per item within the deadlines; codes (KILLED, OOM, DIED) on failure.

        All items are submitted at once (workers stay busy) except ``held`` ones, which wait for
        ``on_done`` to release them (``batch.submit(i)``) or settle them (``batch.finish(i, r)``).
        """
        if not arglists:
            return []
        batch = _Batch(self, fn, arglists, held, on_done)
        return batch.run()

    # ---- gold answers -------------------------------------------------------------------------

    def _prepared_gold(self, key: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
        """Boxed, normalised gold alternatives and, when none is usable, the reason (rule checks)."""
        with self._lock:
            hit = self._gold_cache.get(key)
            if hit is not None:
                self._gold_cache.move_to_end(key)
                return hit
        prepared, reason = [], None if key else "empty"
        for g in key:
            if self.max_gold_chars is not None and len(g) > self.max_gold_chars:
                reason = reason or f"{len(g)} characters, over max_gold_chars={self.max_gold_chars}"
                continue
            latex = _gold_latex(g)
            if not _balanced(latex):
                reason = reason or "unbalanced braces"
                continue
            prepared.append(latex)
        hit = (tuple(prepared), None if prepared else reason)
        with self._lock:
            self._gold_cache[key] = hit
            if len(self._gold_cache) > 4096:
                self._gold_cache.popitem(last=False)
        return hit

    def _mark_gold(self, key: tuple[str, ...], gold, reason: str | None) -> None:
        """Remember a gold as good (``reason`` None) or bad; warn once per distinct bad gold."""
        with self._lock:
            table = self._good_golds if reason is None else self._bad_golds
            new = key not in table
            table[key] = None
            table.move_to_end(key)
            if len(table) > 16384:
                table.popitem(last=False)
            if reason is not None:
                self._good_golds.pop(key, None)
        if new and reason is not None:
            shown = repr(gold) if len(repr(gold)) <= 200 else repr(gold)[:200] + f"... ({len(repr(gold))} chars)"
            logger.warning("math reward: cannot parse gold answer %s (%s); its completions get None", shown, reason)

    def _grade_codes(self, predictions: list[str], golds: list) -> tuple[list[int], list[str | None]]:
        """Result code and extracted answer per completion.

        The first completion of a gold not yet known good is a probe: the rest of its group waits
        for it, so an unparseable gold (or one whose parse times out) costs one task, not one per
        completion, and is then remembered. A probe killed at the hard deadline leaves it open
        whether the gold or the completion hung: one gold-only check decides.
        """
        if len(predictions) != len(golds):
            raise ValueError(f"got {len(predictions)} predictions but {len(golds)} gold answers")
        n = len(predictions)
        codes: list[int | None] = [None] * n
        extracted: list[str | None] = [None] * n
        todo, idx, keys, held = [], [], [], []
        probe: dict[tuple[str, ...], int] = {}  # gold key -> task that decides whether it parses
        followers: dict[tuple[str, ...], list[int]] = {}
        origin: dict[int, int] = {}  # check task -> the probe it double-checks
        for i, (pred, gold) in enumerate(zip(predictions, golds)):
            key = _gold_key(gold)
            with self._lock:
                bad, good = key in self._bad_golds, key in self._good_golds
            prepared, reason = self._prepared_gold(key) if not bad else ((), None)
            if bad or not prepared:
                codes[i] = GOLD_BAD
                if not bad:
                    self._mark_gold(key, gold, reason)
                continue
            j = len(todo)
            todo.append((pred if isinstance(pred, str) else as_text(pred), prepared))
            idx.append(i)
            keys.append(key)
            if not good:
                if key in probe:
                    held.append(j)
                    followers[key].append(j)
                else:
                    probe[key], followers[key] = j, []

        def on_done(batch: _Batch, j: int, res) -> None:
            key = keys[j]
            if probe.get(key) != j:
                return
            code = res[0] if isinstance(res, tuple) else res
            gold = golds[idx[origin.get(j, j)]]
            if code in (GOLD_BAD, GOLD_TIMEOUT) or (code == KILLED and j in origin):
                self._mark_gold(key, gold, "math-verify cannot parse it" if code == GOLD_BAD else "its parse timed out")
                batch.out[origin.get(j, j)] = GOLD_BAD  # the probe (finished already)
                for f in followers.pop(key):
                    batch.finish(f, GOLD_BAD)
            elif code == KILLED:  # the gold or the completion hung: a gold-only check decides
                keys.append(key)
                probe[key] = batch.add(("", batch.args[j][1]))
                origin[probe[key]] = j
            else:
                if code not in (OOM, DIED):
                    self._mark_gold(key, gold, None)
                for f in followers.pop(key):
                    batch.submit(f)

        results = self._run(_grade_task, todo, held, on_done)
        for i, key, res in zip(idx, keys, results):
            code, ext = res if isinstance(res, tuple) else (res, None)
            if code == GOLD_TIMEOUT:  # not from a probe: the gold parsed elsewhere; this one ran late
                code = TIMED_OUT
            codes[i], extracted[i] = (TIMED_OUT if code == KILLED else code), ext
        with self._lock:
            s = self._stats
            for c in codes:
                s["graded"] += 1
                s["correct"] += c == CORRECT
                s["gold_unparseable"] += c == GOLD_BAD
                s["pred_unparseable"] += c == PRED_BAD
                s["timed_out"] += c == TIMED_OUT
                s["worker_died"] += c == DIED
                s["out_of_memory"] += c == OOM
        return codes, extracted

    # ---- public API ---------------------------------------------------------------------------

    def grade(self, predictions: list[str], golds: list[str | list[str]]) -> list[float | None]:
        """1.0 / 0.0 per completion text; None where the gold answer cannot be parsed."""
        codes, _ = self._grade_codes(predictions, golds)
        return [None if c == GOLD_BAD else float(c == CORRECT) for c in codes]

    def equivalent(self, a: str, b: str) -> bool:
        """Whether two extracted answers are the same mathematical object (symmetric; cached)."""
        if a == b:
            return True
        key = (a, b) if a <= b else (b, a)
        with self._lock:
            if key in self._equiv_cache:
                return self._equiv_cache[key]
        code = self._run(_equiv_task, [key])[0]
        result = code == CORRECT
        if code in (CORRECT, WRONG):  # do not cache timeouts or crashes
            with self._lock:
                self._equiv_cache[key] = result
                if len(self._equiv_cache) > 65536:
                    self._equiv_cache.popitem(last=False)
        return result

    def extract(self, texts: list[str]) -> list[str | None]:
        """math-verify's extracted final-answer string per completion; None if none (or timeout)."""
        res = self._run(_extract_task, [(as_text(t),) for t in texts])
        return [r if isinstance(r, str) else None for r in res]


_DEFAULT: MathGrader | None = None
_DEFAULT_LOCK = threading.Lock()


def default_grader() -> MathGrader:
    """The process's shared grader (timeout 5 s, default workers), created on first use.

    Everything in capo-trl that grades without being handed a grader uses this one, so a process
    runs one pool of workers, not one per caller.
    """
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = MathGrader()
        return _DEFAULT
