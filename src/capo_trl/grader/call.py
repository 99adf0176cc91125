"""One grading call: completions grouped by gold and by the answer that decides them, each distinct
(answer, gold) settled once: from the verdicts of earlier calls, an exact shortcut, or a worker.

Bookkeeping over the pieces it is handed (the gold book, the verdict cache, a function that runs
worker tasks under deadlines): it knows nothing of pools or processes.
"""

from __future__ import annotations

from collections.abc import Callable

from .fast import answer_key, fast_verdict, plain_number
from .memory import GoldBook, Verdicts
from .normalize import _gold_key, as_text, prepared_text
from .pool import _Batch
from .worker import (
    _BOX_OPEN,
    _CHUNK,
    _CHUNK_BUDGET,
    _MAX_LOGGED,
    CORRECT,
    DIED,
    GOLD_BAD,
    GOLD_TIMEOUT,
    KILLED,
    PRED_BAD,
    TIMED_OUT,
    WRONG,
    _chunk_task,
)


def grade_codes(predictions: list, golds: list, book: GoldBook, verdicts: Verdicts | None, run: Callable):
    """Result code and extracted answer per completion, and counters of how they were settled.

    ``verdicts`` None: no shortcut, no deduplication, no cache (every completion to a worker).
    ``run(fn, arglists, held, on_done, extra=..., size=...)`` runs worker tasks under the deadlines.

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
    call = _Call(book, verdicts)
    codes = call.group(predictions, golds)
    call.plan()
    run(_chunk_task, call.arglists, call.held, call.on_done, extra=_chunk_extra, size=len(predictions))
    return call.collect(codes)


def _chunk_extra(args) -> float:
    """A chunk of several answers may start them for ``_CHUNK_BUDGET`` s: its deadline has that much more."""
    return _CHUNK_BUDGET if len(args[0]) > 1 else 0.0


class _Call:
    """One call's state: its golds' work, the worker tasks (each with its gold and answer keys), and
    what to do when a task finishes (settle verdicts, release held tasks, retry one per task)."""

    def __init__(self, book: GoldBook, verdicts: Verdicts | None):
        self.book, self.verdicts = book, verdicts
        self.work: dict[tuple[str, ...], _GoldWork] = {}
        self.tasks: list[tuple[_GoldWork, list]] = []  # task index -> (its gold, the answer keys it grades)
        self.arglists: list = []
        self.held: list[int] = []

    def group(self, predictions: list, golds: list) -> list[int | None]:
        """Each completion into its gold's work; the codes known already (an unusable gold)."""
        codes: list[int | None] = [None] * len(predictions)
        for i, (pred, gold) in enumerate(zip(predictions, golds)):
            key = _gold_key(gold)
            bad, good = self.book.known(key)
            prepared, reason = self.book.prepared(key) if not bad else ((), None)
            if bad or not prepared:
                codes[i] = GOLD_BAD
                if not bad:
                    self.book.mark(key, gold, reason)
                continue
            w = self.work.get(key)
            if w is None:
                w = self.work[key] = _GoldWork(key, gold, prepared, good, self.verdicts)
            w.add(i, prepared_text(pred if isinstance(pred, str) else as_text(pred)))
        return codes

    def task(self, w: _GoldWork, qkeys: list) -> tuple:
        self.tasks.append((w, qkeys))
        texts = tuple("" if q is None else w.texts[q] for q in qkeys)
        return texts, w.prepared, _CHUNK_BUDGET

    def plan(self) -> None:
        """The first round of tasks: chunks of each gold's slow answers; a gold not known good probes first."""
        for w in self.work.values():
            slow = w.slow()
            if not w.good and not slow and w.waiting:
                slow = [None]  # only shortcut verdicts: a gold-only check decides whether they stand
            for c in range(0, len(slow), _CHUNK):
                hold = not w.good and c > 0
                if not w.good and c == 0:
                    w.probe = len(self.tasks)
                args = self.task(w, slow[c : c + _CHUNK])
                if hold:
                    w.held.append(len(self.tasks) - 1)
                    self.held.append(len(self.tasks) - 1)
                self.arglists.append(args)

    def add(self, batch: _Batch, w: _GoldWork, qkeys: list) -> int:
        return batch.add(self.task(w, qkeys))

    def gold_good(self, batch: _Batch, w: _GoldWork) -> None:
        if not w.good:
            w.good = True
            self.book.mark(w.key, w.gold, None)
        w.settle_waiting()
        for j in w.held:
            batch.submit(j)
        for q in w.after_check:
            self.add(batch, w, [q])
        w.held, w.after_check = [], []

    def gold_bad(self, batch: _Batch, w: _GoldWork, why: str) -> None:
        self.book.mark(w.key, w.gold, why)
        w.settle_all(GOLD_BAD)
        for j in w.held:
            batch.finish(j, GOLD_BAD)
        w.held, w.after_check = [], []

    def on_done(self, batch: _Batch, j: int, res) -> None:
        """Task ``j`` finished: verdicts per answer (a tuple), or one code for the whole task."""
        w, qkeys = self.tasks[j]
        if isinstance(res, tuple):
            self.graded(batch, w, qkeys, res, w.probe == j)
        else:
            self.failed(batch, w, qkeys, res, w.probe == j)

    def graded(self, batch: _Batch, w: _GoldWork, qkeys: list, res: tuple, is_probe: bool) -> None:
        first = res[0]
        if isinstance(first, tuple) and first[0] in (GOLD_BAD, GOLD_TIMEOUT):
            if is_probe:
                return self.gold_bad(batch, w, "math-verify cannot parse it" if first[0] == GOLD_BAD
                                     else "its parse timed out")
            return w.settle_each(qkeys, TIMED_OUT)  # parsed elsewhere; this worker ran late
        rest = [q for q, r in zip(qkeys, res) if r is None]
        for q, r in zip(qkeys, res):
            if r is not None and q is not None:
                w.settle(q, r)
        if is_probe:
            self.gold_good(batch, w)
        if rest:
            self.add(batch, w, rest)

    def failed(self, batch: _Batch, w: _GoldWork, qkeys: list, res: int, is_probe: bool) -> None:
        if res == GOLD_BAD:  # a held task of a gold its probe found unparseable
            return
        if qkeys == [None]:  # the gold-only check itself failed
            if res == KILLED:
                return self.gold_bad(batch, w, "its parse timed out")
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
            w.probe = self.add(batch, w, [None])
        elif len(answers) > 1:  # one of them hung or took its worker down: one per task now
            for q in answers:
                self.add(batch, w, [q])
        else:
            w.settle_each(answers, TIMED_OUT if res == KILLED else res)

    def collect(self, codes: list[int | None]):
        """(codes, extracted answers, counters) once the tasks have run."""
        extracted: list[str | None] = [None] * len(codes)
        for w in self.work.values():
            for code_ext, items in w.results():
                for i in items:
                    codes[i], extracted[i] = code_ext
        counts = dict.fromkeys(("fast_path", "cached", "deduplicated"), 0)
        for w in self.work.values():
            for k, v in w.counts.items():
                counts[k] += v
        counts["worker_tasks"] = len(self.tasks)
        return codes, extracted, counts


class _GoldWork:
    """One gold's completions within a call: its distinct answers, their verdicts, its probe."""

    def __init__(self, key: tuple[str, ...], gold, prepared: tuple[str, ...], good: bool, verdicts: Verdicts | None):
        self.key, self.gold, self.prepared, self.good = key, gold, prepared, good
        self.fast, self.cache = verdicts is not None, verdicts
        self.gold_answer = answer_key(prepared[0]) if self.fast and len(prepared) == 1 else None
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

    def add(self, i: int, text: str) -> None:
        ans = answer_key(text) if self.fast else None
        q = ("box", ans) if ans is not None else ("text", text) if self.fast else ("item", i)
        if q in self.items:
            self.items[q].append(i)
            return
        self.items[q] = [i]
        self.texts[q] = _BOX_OPEN + ans + "}" if ans is not None else text
        if not self.fast:
            return
        hit = self.cache.get((q, self.prepared))
        if hit is not None:
            self.verdicts[q], self.source[q] = hit, "cached"
        elif ans is not None and self.gold_answer is not None:
            code = fast_verdict(ans, self.gold_answer)
            if code is not None:
                (self.verdicts if self.good else self.waiting)[q] = (code, ans[:_MAX_LOGGED])
                self.source[q] = "fast_path"

    def slow(self) -> list[tuple]:
        return [q for q in self.items if q not in self.verdicts and q not in self.waiting]

    def settle(self, q: tuple, verdict: tuple[int, str | None]) -> None:
        self.verdicts[q] = verdict
        if q[0] != "item" and len(q[1]) <= 2000 and verdict[0] in (CORRECT, WRONG, PRED_BAD):
            self.cache.put((q, self.prepared), verdict)  # never a timeout or a crash: those may pass next time

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
