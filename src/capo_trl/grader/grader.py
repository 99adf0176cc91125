"""The grading API: grade completions against gold answers, compare two answers, extract one; the pool's owner."""

from __future__ import annotations

import atexit
import logging
import math
import multiprocessing
import os
import sys
import threading
import weakref

from .call import grade_codes
from .fast import answer_key, fast_verdict, plain_number
from .memory import GoldBook, Verdicts
from .normalize import answer_span, as_text, prepared_text
from .pool import _STOP_WAIT, _Batch, _default_workers, _is_int, _Workers
from .worker import (
    _CHUNK,
    _CHUNK_BUDGET,
    _GRACE,
    CORRECT,
    DIED,
    GOLD_BAD,
    OOM,
    PRED_BAD,
    TIMED_OUT,
    WRONG,
    _configs,
    _equiv_task,
    _extract_task,
    _warm_parser,
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
        fast_path: shortcuts, per-call deduplication and the verdict cache (``False``: none of them).
        cache_size: verdicts remembered across calls (least recently used dropped; 0: none).

    Speed: each distinct (answer, gold) of a call is graded once; exact shortcuts and a cache of
    ``cache_size`` verdicts from earlier calls settle many without a worker (``fast_path=False``
    sends every completion to the workers: the reference path the shortcuts are tested against);
    the rest go to workers in chunks of up to 16 answers of one gold.

    Deadlines: a task of one answer is killed at ``timeout + 0.5`` s, a chunk of several at
    ``timeout + 1.5`` s (it starts answers for at most 1 s, so each gets ``timeout + 0.5`` s from its
    start); the answers of a killed chunk are then graded one per task, and one killed alone scores
    0.0 (``timed_out``). A worker that dies
    under a task (OOM killer, segfault) gets it retried once; a pool that wedges (a task lost by
    pebble: pending with no worker running any task for 1 s; or no task finishing for
    ``timeout + 2.5`` s) is stopped and rebuilt and its unfinished tasks retried once. An item that
    fails again scores 0.0 (``worker_died``). Whatever happens, a call on ``n`` items returns within
    ``batch_time_limit(n) = 2 * (ceil(3 n / workers) + min(n, 16) + 3) * (timeout + 2.5) + 10``
    seconds (with ``fork``; ``timeout + 21.5`` per slot with ``spawn``/``forkserver``, whose workers
    start slowly).
    """

    _STAT_KEYS = ("graded", "correct", "gold_unparseable", "pred_unparseable", "timed_out", "worker_died",
                  "out_of_memory", "fast_path", "cached", "deduplicated", "worker_tasks")  # fmt: skip

    def __init__(
        self,
        timeout: int = 5,
        workers: int | None = None,
        mp_context: str | None = None,
        memory_limit_mb: int | None = 4096,
        max_gold_chars: int | None = 2000,
        fast_path: bool = True,
        cache_size: int = 65536,
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
        if not isinstance(fast_path, bool):
            raise ValueError(f"fast_path must be True or False, got {fast_path!r}")
        if not _is_int(cache_size, 0):
            raise ValueError(f"cache_size must be an integer >= 0 (0: no cache), got {cache_size!r}")
        self.memory_limit_mb, self.max_gold_chars = memory_limit_mb, max_gold_chars
        self.fast_path, self.cache_size = fast_path, cache_size
        self._verdicts = Verdicts(cache_size)  # (answer key, prepared gold) -> verdict, across calls
        self._lock = threading.Lock()
        self._pool: _Workers | None = None
        self._stats = dict.fromkeys(self._STAT_KEYS, 0)
        self._golds = GoldBook(max_gold_chars)
        self._equiv_cache = Verdicts(65536)
        _LIVE.add(self)

    # ---- deadlines ------------------------------------------------------------------------

    @property
    def _slot(self) -> float:
        """Longest one task can hold a worker: deadline (a chunk may start items for
        ``_CHUNK_BUDGET`` s) + pebble's polling, the kill, a fresh worker."""
        return self.timeout + _GRACE + _CHUNK_BUDGET + (1.0 if self.mp_context == "fork" else 20.0)

    @property
    def _idle(self) -> float:
        return 1.0 if self.mp_context == "fork" else self._slot

    def batch_time_limit(self, n: int) -> float:
        """Seconds within which a call on ``n`` items returns, whatever the workers do.

        Two rounds (the second after a wedged pool is rebuilt) of ``ceil(3 n / workers)`` task slots
        (an item can be in a chunk that is killed, then in a task of its own, and its gold may need a
        gold-only check) plus the tasks that must run one after another: a gold's probe, its check,
        its further chunks and the continuations of a chunk that ran out of time
        (``min(n, _CHUNK) + 3``); plus ``2 * 5`` s to stop pools. Work still unfinished then is
        abandoned and scores 0.0.
        """
        return 2 * (math.ceil(3 * n / self.workers) + min(n, _CHUNK) + 3) * self._slot + 2 * _STOP_WAIT

    # ---- lifecycle ------------------------------------------------------------------------

    def _get_pool(self) -> _Workers:
        with self._lock:
            old = self._pool
            if old is not None and old.pid == os.getpid() and not old.closed and old.pool.active:
                return old
            _configs()  # import math-verify before forking, so (re)started workers inherit it
            from math_verify.parser import get_extraction_regexes

            get_extraction_regexes(_configs()[1])  # compile math-verify's big regexes pre-fork
            if self.mp_context == "fork":
                _warm_parser()
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

    def _run(self, fn, arglists: list[tuple], held=(), on_done=None, extra=None, size: int | None = None) -> list:
        """Run ``fn(*args, timeout)`` per item within the deadlines; codes (KILLED, OOM, DIED) on failure.

        All items are submitted at once (workers stay busy) except ``held`` ones, which wait for
        ``on_done`` to release them (``batch.submit(i)``) or settle them (``batch.finish(i, r)``).
        """
        if not arglists:
            return []
        batch = _Batch(self, fn, arglists, held, on_done, extra, size)
        return batch.run()

    # ---- grading ----------------------------------------------------------------------------

    def _grade_codes(self, predictions: list[str], golds: list) -> tuple[list[int], list[str | None]]:
        """Result code and extracted answer per completion (:func:`~capo_trl.grader.call.grade_codes`)."""
        verdicts = self._verdicts if self.fast_path else None
        codes, extracted, counts = grade_codes(predictions, golds, self._golds, verdicts, self._run)
        with self._lock:
            s = self._stats
            for k, v in counts.items():
                s[k] += v
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
        hit = self._equiv_cache.get(key)
        if hit is not None:
            return hit
        if self.fast_path and plain_number(a) is not None and plain_number(b) is not None:
            code = fast_verdict(a, b)  # two plain numbers: known without a worker when equal or far apart
            if code is not None:
                return code == CORRECT
        code = self._run(_equiv_task, [key])[0]
        result = code == CORRECT
        if code in (CORRECT, WRONG):  # do not cache timeouts or crashes
            self._equiv_cache.put(key, result)
        return result

    def extract(self, texts: list[str]) -> list[str | None]:
        """math-verify's extracted final-answer string per completion; None if none (or timeout).

        With ``fast_path``, a completion whose reading is decided by one box holding an integer or a
        decimal (:func:`~capo_trl.grader.fast.answer_key`) is read in this process: math-verify extracts
        exactly that content (``tests/test_grader_fast.py``), and no worker round trip is needed.
        """
        texts = [as_text(t) for t in texts]
        out: list[str | None] = [_plain_answer(t) if self.fast_path else None for t in texts]
        slow = [i for i, known in enumerate(out) if known is None]
        for i, r in zip(slow, self._run(_extract_task, [(texts[i],) for i in slow])):
            out[i] = r if isinstance(r, str) else None
        return out

    def answer_spans(self, completions, **kwargs) -> list[tuple[int, int] | None]:
        """Where each completion's final answer is, as ``(start, end)`` characters of its text: what the grader
        reads, so a score over those characters is the answer's own confidence (``CAPOConfig.score_span``).

        The last run of boxes, or a completion that is only a number, is found here; any other answer is
        math-verify's extracted string, taken at its last occurrence in the text. None: no answer (nothing
        extracted, or the extracted string is not written as such in the text).
        """
        texts = [as_text(c) for c in completions]
        out = [answer_span(t) for t in texts]
        rest = [i for i, span in enumerate(out) if span is None]
        for i, extracted in zip(rest, self.extract([texts[i] for i in rest]) if rest else []):
            at = texts[i].rfind(extracted) if extracted else -1
            if at >= 0:
                out[i] = (at, at + len(extracted))
        return out


def _plain_answer(text: str) -> str | None:
    """The integer or decimal that alone decides math-verify's reading of ``text``, else None (a fraction
    is not read as written: math-verify spells ``\\dfrac`` as ``\\frac``)."""
    key = answer_key(prepared_text(text))
    return key if key is not None and "\\" not in key and plain_number(key) is not None else None


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
