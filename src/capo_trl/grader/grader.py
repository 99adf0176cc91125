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

from .fast import answer_key, fast_verdict, plain_number
from .normalize import as_text, _balanced, _gold_key, _gold_latex, prepared_text
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
    _BOX_OPEN,
    _CHUNK,
    _CHUNK_BUDGET,
    _MAX_LOGGED,
    _chunk_task,
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
        self._verdicts: OrderedDict[tuple, tuple[int, str | None]] = OrderedDict()
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

        Completions are grouped by gold and, within a gold, by the answer that decides their verdict
        (:func:`~capo_trl.grader.fast.answer_key`; the whole prepared text when there is none): each
        distinct (answer, gold) is graded once. A verdict comes, in this order, from the cache of
        earlier calls, from an exact shortcut (:func:`~capo_trl.grader.fast.fast_verdict`), or from
        a worker, which grades up to ``_CHUNK`` answers of one gold per round trip.

        The first task of a gold not yet known good is a probe: the gold's other tasks and its
        shortcut verdicts wait for it, so an unparseable gold (or one whose parse times out) costs one
        task, not one per completion, and is then remembered. A probe killed at the hard deadline
        leaves it open whether the gold or an answer hung: one gold-only check decides, and the
        probe's answers are then graded one per task.
        """
        if len(predictions) != len(golds):
            raise ValueError(f"got {len(predictions)} predictions but {len(golds)} gold answers")
        n = len(predictions)
        codes: list[int | None] = [None] * n
        extracted: list[str | None] = [None] * n
        work: dict[tuple[str, ...], _GoldWork] = {}
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
            w = work.get(key)
            if w is None:
                w = work[key] = _GoldWork(key, gold, prepared, good, self.fast_path)
            w.add(i, prepared_text(pred if isinstance(pred, str) else as_text(pred)), self)

        tasks: list[tuple[_GoldWork, list]] = []  # task index -> (its gold, the answer keys it grades)
        arglists, held = [], []

        def task(w: _GoldWork, qkeys: list, hold: bool) -> tuple[tuple, bool]:
            tasks.append((w, qkeys))
            texts = tuple("" if q is None else w.texts[q] for q in qkeys)
            return (texts, w.prepared, _CHUNK_BUDGET), hold

        for w in work.values():
            slow = w.slow()
            if not w.good and not slow and w.waiting:
                slow = [None]  # only shortcut verdicts: a gold-only check decides whether they stand
            for c in range(0, len(slow), _CHUNK):
                hold = not w.good and c > 0
                if not w.good and c == 0:
                    w.probe = len(tasks)
                args, hold = task(w, slow[c : c + _CHUNK], hold)
                if hold:
                    w.held.append(len(tasks) - 1)
                    held.append(len(tasks) - 1)
                arglists.append(args)

        def add(batch: _Batch, w: _GoldWork, qkeys: list) -> int:
            args, _ = task(w, qkeys, False)
            return batch.add(args)

        def gold_good(batch: _Batch, w: _GoldWork) -> None:
            if not w.good:
                w.good = True
                self._mark_gold(w.key, w.gold, None)
            w.settle_waiting()
            for j in w.held:
                batch.submit(j)
            for q in w.after_check:
                add(batch, w, [q])
            w.held, w.after_check = [], []

        def gold_bad(batch: _Batch, w: _GoldWork, why: str) -> None:
            self._mark_gold(w.key, w.gold, why)
            w.settle_all(GOLD_BAD)
            for j in w.held:
                batch.finish(j, GOLD_BAD)
            w.held, w.after_check = [], []

        def on_done(batch: _Batch, j: int, res) -> None:
            w, qkeys = tasks[j]
            is_probe = w.probe == j
            if isinstance(res, tuple):
                first = res[0]
                if isinstance(first, tuple) and first[0] in (GOLD_BAD, GOLD_TIMEOUT):
                    if is_probe:
                        return gold_bad(batch, w, "math-verify cannot parse it" if first[0] == GOLD_BAD
                                        else "its parse timed out")
                    return w.settle_each(qkeys, TIMED_OUT)  # parsed elsewhere; this worker ran late
                rest = [q for q, r in zip(qkeys, res) if r is None]
                for q, r in zip(qkeys, res):
                    if r is not None and q is not None:
                        w.settle(q, r, self)
                if is_probe:
                    gold_good(batch, w)
                if rest:
                    add(batch, w, rest)
                return
            if res == GOLD_BAD:  # a held task of a gold its probe found unparseable
                return
            if qkeys == [None]:  # the gold-only check itself failed
                if res == KILLED:
                    return gold_bad(batch, w, "its parse timed out")
                w.settle_all(res)
                for k in w.held:
                    batch.finish(k, res)
                w.held = []
                return
            answers = [q for q in qkeys if q is not None]
            if is_probe:  # which hung or died, the gold or an answer? a gold-only check decides
                if len(answers) == 1:
                    w.settle_each(answers, TIMED_OUT if res == KILLED else res)  # stands if the gold parses
                else:
                    w.after_check += answers
                w.probe = add(batch, w, [None])
            elif len(answers) > 1:  # one of them hung or took its worker down: one per task now
                for q in answers:
                    add(batch, w, [q])
            else:
                w.settle_each(answers, TIMED_OUT if res == KILLED else res)

        def extra(args) -> float:  # a chunk of several answers may start them for _CHUNK_BUDGET s
            return _CHUNK_BUDGET if len(args[0]) > 1 else 0.0

        self._run(_chunk_task, arglists, held, on_done, extra=extra, size=n)
        for w in work.values():
            for code_ext, items in w.results():
                for i in items:
                    codes[i], extracted[i] = code_ext
        with self._lock:
            s = self._stats
            s["worker_tasks"] += len(tasks)
            for w in work.values():
                for k, v in w.counts.items():
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

    def _cached(self, key) -> tuple[int, str | None] | None:
        with self._lock:
            hit = self._verdicts.get(key)
            if hit is not None:
                self._verdicts.move_to_end(key)
            return hit

    def _remember(self, key, verdict: tuple[int, str | None]) -> None:
        if verdict[0] not in (CORRECT, WRONG, PRED_BAD) or not self.cache_size:
            return  # never a timeout or a crash: those may pass next time
        with self._lock:
            self._verdicts[key] = verdict
            self._verdicts.move_to_end(key)
            while len(self._verdicts) > self.cache_size:
                self._verdicts.popitem(last=False)

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


class _GoldWork:
    """One gold's completions within a call: its distinct answers, their verdicts, its probe."""

    def __init__(self, key: tuple[str, ...], gold, prepared: tuple[str, ...], good: bool, fast: bool):
        self.key, self.gold, self.prepared, self.good, self.fast = key, gold, prepared, good, fast
        self.gold_answer = answer_key(prepared[0]) if fast and len(prepared) == 1 else None
        if self.gold_answer is not None and plain_number(self.gold_answer) is not None:
            self.good = True  # a plain number always parses: no probe needed
        self.items: dict[tuple, list[int]] = {}  # answer key -> completions it decides
        self.texts: dict[tuple, str] = {}  # answer key -> the prepared text a worker grades
        self.verdicts: dict[tuple, tuple[int, str | None]] = {}
        self.waiting: dict[tuple, tuple[int, str | None]] = {}  # shortcut verdicts: stand once the gold parses
        self.source: dict[tuple, str] = {}  # "cached" / "fast_path" (else a worker graded it)
        self.probe: int | None = None
        self.held: list[int] = []  # tasks waiting for the probe
        self.after_check: list[tuple] = []  # answers to grade one per task once the gold check passes

    def add(self, i: int, text: str, grader: MathGrader) -> None:
        ans = answer_key(text) if self.fast else None
        q = ("box", ans) if ans is not None else ("text", text) if self.fast else ("item", i)
        if q in self.items:
            self.items[q].append(i)
            return
        self.items[q] = [i]
        self.texts[q] = _BOX_OPEN + ans + "}" if ans is not None else text
        if not self.fast:
            return
        hit = grader._cached((q, self.prepared))
        if hit is not None:
            self.verdicts[q], self.source[q] = hit, "cached"
        elif ans is not None and self.gold_answer is not None:
            code = fast_verdict(ans, self.gold_answer)
            if code is not None:
                (self.verdicts if self.good else self.waiting)[q] = (code, ans[:_MAX_LOGGED])
                self.source[q] = "fast_path"

    def slow(self) -> list[tuple]:
        return [q for q in self.items if q not in self.verdicts and q not in self.waiting]

    def settle(self, q: tuple, verdict: tuple[int, str | None], grader: MathGrader) -> None:
        self.verdicts[q] = verdict
        if q[0] != "item" and len(q[1]) <= 2000:
            grader._remember((q, self.prepared), verdict)

    def settle_each(self, qs, code: int) -> None:
        for q in qs:
            if q is not None:
                self.verdicts[q] = (code, None)

    def settle_waiting(self) -> None:
        self.verdicts.update(self.waiting)
        self.waiting = {}

    def settle_all(self, code: int) -> None:
        self.waiting = {}
        self.settle_each(self.items, code)

    def results(self):
        """(verdict, completions) per answer; unsettled ones (the call's deadline passed) died."""
        for q, items in self.items.items():
            yield self.verdicts.get(q, (DIED, None)), items

    @property
    def counts(self) -> dict[str, int]:
        out = {"fast_path": 0, "cached": 0, "deduplicated": 0}
        for q, items in self.items.items():
            out["deduplicated"] += len(items) - 1
            if q in self.source and q in self.verdicts:
                out[self.source[q]] += len(items)
        return out


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
