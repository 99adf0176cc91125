"""Math accuracy reward: math-verify in killable worker processes, with gold-answer fixes.

Why workers: math-verify's timeouts use ``signal.alarm`` (main thread only) and cannot interrupt C
code (huge integer powers, ``str()`` of some sympy objects), so inputs such as ``9^{9^{9^{9}}}``
hang a training run. Every item runs in a pebble worker with a hard deadline enforced by the
parent; an overrunning worker is killed and replaced, and only that item scores 0.0.

Why fork (the default on Linux): the parent imports math-verify once and forked workers inherit
it, so a replacement worker is ready in milliseconds; with ``spawn``/``forkserver`` each worker
re-imports sympy and the caller's package (~1 s, several seconds if torch is pulled in). Workers
never touch torch, so torch's OpenMP/CUDA state in the parent is not an issue. Pass
``mp_context="forkserver"`` if your process forks badly (e.g. threads holding C-level locks).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import re
import sys
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout

from pebble import ProcessExpired, ProcessPool

logger = logging.getLogger(__name__)

__all__ = ["MathReward", "boxed_format_reward", "last_boxed", "math_accuracy_reward"]

# Result codes sent back by workers (plain ints: nothing sympy ever crosses the process boundary).
CORRECT, WRONG, GOLD_BAD, PRED_BAD, TIMED_OUT, DIED = 1, 0, 2, 3, 4, 5
_GRACE = 0.5  # parent deadline = timeout + grace, so math-verify's own alarm usually wins (no kill)
_MAX_LOGGED = 200  # extracted strings logged to TRL's table are cut to this many characters

# --------------------------------------------------------------------------------------------
# text normalisation: pure string work, linear regexes, safe to run anywhere
# --------------------------------------------------------------------------------------------

# ``4.5e33`` -> ``4.5\times10^{33}``: math-verify reads ``e`` as Euler's number (docs/reward.md).
_SCI = re.compile(r"(?<![\w.\\])(\d+(?:\.\d+)?)[eE]([+-]?\d{1,4})(?![\w.])")
# ``\frac12``, ``\frac1{2}``, ``\sqrt3``: valid TeX that latex2sympy cannot parse unbraced.
_BARE_ARG = re.compile(r"\\(dfrac|tfrac|frac|sqrt)(?:\s*(\d)|\s+([A-Za-z]))")
_BAL = r"\{(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\}"  # balanced braces, 3 levels deep, no backtracking
_BARE_ARG2 = re.compile(r"(\\[dt]?frac\s*" + _BAL + r")\s*(\d|[A-Za-z](?![A-Za-z]))")
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_JOIN = re.compile(r"[\s$,;.]*(?:(?:and|or|,)[\s$]*)?")  # text between boxes of one answer
_DOLLAR = re.compile(r"(?<!\\)\$")
_CANON = re.compile(r"\s+|\\left|\\right|\\[,;:!]|[{}$]|\\text|\\mathrm")
_DELIMS = ((r"\[", r"\]"), (r"\(", r"\)"), ("$$", "$$"), ("$", "$"))


def _normalize(text: str) -> str:
    """Rewrite notations math-verify misreads; a no-op for everything else."""
    if "e" in text or "E" in text:
        text = _SCI.sub(lambda m: f"{m.group(1)}\\times10^{{{int(m.group(2))}}}", text)
    if "\\" in text:
        text = _BARE_ARG.sub(lambda m: f"\\{m.group(1)}{{{m.group(2) or m.group(3)}}}", text)
        text = _BARE_ARG2.sub(lambda m: f"{m.group(1)}{{{m.group(2)}}}", text)
    return text


def _box_spans(text: str) -> list[tuple[int, int]]:
    """(start of ``\\boxed``, index of its closing brace) for each outermost balanced box."""
    spans: list[tuple[int, int]] = []
    for m in _BOX.finditer(text):
        if spans and m.start() < spans[-1][1]:
            continue  # nested in the previous box
        depth = 1
        for i in range(m.end(), len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    spans.append((m.start(), i))
                    break
    return spans


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox``) with balanced braces, else None."""
    spans = _box_spans(text) if "\\" in text else []
    if not spans:
        return None
    start, end = spans[-1]
    return text[_BOX.match(text, start).end() : end]


def _final_boxes(text: str) -> str:
    """Keep the last run of boxes: ``\\boxed{7} ... wait ... \\boxed{8}`` answers 8, while
    ``$\\boxed{2}$ and $\\boxed{3}$`` still answers {2, 3} (math-verify would join all boxes)."""
    if text.count("\\boxed") + text.count("\\fbox") < 2:
        return text
    spans = _box_spans(text)
    if len(spans) < 2:
        return text
    first = len(spans) - 1
    while first > 0 and _JOIN.fullmatch(text, spans[first - 1][1] + 1, spans[first][0]):
        first -= 1
    if first < len(spans) - 1:  # several boxes, one answer: a form math-verify reads as a set
        return ", ".join(text[a : b + 1] for a, b in spans[first:])
    return text[spans[-1][0] :]


def _gold_latex(gold: str) -> str:
    """Bare dataset answer -> ``\\boxed{...}``: parsed raw, ``2\\sqrt{3}`` reads as 2 (trap 1)."""
    g = gold.strip()
    boxed = last_boxed(g) if "\\" in g else None
    if boxed is not None:
        g = boxed
    else:
        for left, right in _DELIMS:
            if len(g) > len(left) + len(right) and g.startswith(left) and g.endswith(right):
                g = g[len(left) : -len(right)].strip()
                break
    # Scraped answers such as ``8$,$4`` or ``(0, 1)$.``: stray math delimiters and a final stop.
    g = _DOLLAR.sub("", g).strip().rstrip(".").strip()
    return "\\boxed{" + _normalize(g) + "}"


def _canon(s: str) -> str:
    """String form for answers math-verify keeps only as text (``E_{1},E_{2}`` == ``E_1, E_2``)."""
    return _CANON.sub("", s).lower()


def _as_text(completion) -> str:
    """String completion or chat messages (last assistant turn; content may be a list of parts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)) and completion:
        msgs = [m for m in completion if isinstance(m, dict)]
        assistant = [m for m in msgs if m.get("role", "assistant") == "assistant"] or msgs
        content = assistant[-1].get("content", "") if assistant else ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content if isinstance(content, str) else ""
    return "" if completion is None else str(completion)


def _gold_key(gold) -> tuple[str, ...]:
    """One gold cell -> tuple of acceptable answers (a list means any of them counts)."""
    items = gold if isinstance(gold, (list, tuple)) else [gold]
    return tuple(str(g) for g in items if g is not None and str(g).strip())


# --------------------------------------------------------------------------------------------
# worker side: runs inside pebble workers (main thread there, so math-verify's alarm works)
# --------------------------------------------------------------------------------------------

_CFG: tuple | None = None
_GOLD_CACHE: OrderedDict[tuple[str, int], list] = OrderedDict()


def _configs():
    """Gold and prediction share one LatexExtractionConfig: math-verify caches regexes for one only."""
    global _CFG
    if _CFG is None:
        from latex2sympy2_extended import NormalizationConfig
        from math_verify import ExprExtractionConfig, LatexExtractionConfig

        latex = LatexExtractionConfig(
            boxed_match_priority=0,
            normalization_config=NormalizationConfig(units=True),
            try_extract_without_anchor=False,
        )
        # Expr catches plain-text "the final answer is 42"; anchors only, never a stray number.
        _CFG = ([latex], [latex, ExprExtractionConfig(try_extract_without_anchor=False)])
    return _CFG


def _in_worker() -> None:
    """math-verify logs every timeout with the whole input (megabytes); our counters replace that."""
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _parse(text: str, targets: list, timeout: int) -> tuple[list, bool]:
    """math-verify parse; returns (result, timed_out). An empty result at the alarm = timed out."""
    from math_verify import parse

    t0 = time.monotonic()
    try:
        res = parse(text, targets, extraction_mode="first_match", parsing_timeout=timeout)
    except BaseException:  # math-verify's TimeoutException is a BaseException
        res = []
    return res, (not res and time.monotonic() - t0 >= timeout - 0.05)


def _parse_gold(latex: str, timeout: int) -> tuple[list, bool]:
    """[sympy, str], or [str] when math-verify can only hold it as text, or [] (unparseable).

    Cached per worker (a group of completions shares one gold); failures are not cached.
    """
    key = (latex, timeout)
    hit = _GOLD_CACHE.get(key)
    if hit is not None:
        _GOLD_CACHE.move_to_end(key)
        return hit, False
    res, timed_out = _parse(latex, _configs()[0], timeout)
    if res and isinstance(res[-1], str) and _canon(res[-1]):
        _GOLD_CACHE[key] = res
        if len(_GOLD_CACHE) > 2048:
            _GOLD_CACHE.popitem(last=False)
        return res, False
    return [], timed_out


def _verify(gold: list, pred: list, timeout: int) -> tuple[bool, bool]:
    """Sympy comparison when both parsed; canonical string equality when either is text only."""
    if len(gold) != 2 or len(pred) != 2:
        return bool(gold and pred and _canon(gold[-1]) == _canon(pred[-1])), False
    from math_verify import verify

    t0 = time.monotonic()
    try:
        ok = bool(verify(gold, pred, timeout_seconds=timeout))
    except BaseException:
        ok = False
    return ok, (not ok and time.monotonic() - t0 >= timeout - 0.05)


def _extracted(res: list) -> str | None:
    return res[-1] if res and isinstance(res[-1], str) else None


def _grade_task(pred: str, golds: tuple[str, ...], timeout: int) -> tuple[int, str | None]:
    """Grade one completion against its acceptable gold answers (already ``\\boxed``)."""
    _in_worker()
    parsed_golds, gold_timeout = [], False
    for g in golds:
        res, t = _parse_gold(g, timeout)
        gold_timeout |= t
        if res:
            parsed_golds.append(res)
    if not parsed_golds:
        return (TIMED_OUT if gold_timeout else GOLD_BAD), None
    res, timed_out = _parse(_normalize(_final_boxes(pred)), _configs()[1], timeout)
    extracted = _extracted(res)
    if not res:
        return (TIMED_OUT if timed_out else PRED_BAD), None
    for gold in parsed_golds:  # identical extracted text: no need to ask sympy
        if extracted is not None and gold[-1].strip() == extracted.strip():
            return CORRECT, extracted[:_MAX_LOGGED]
    for gold in parsed_golds:
        ok, t = _verify(gold, res, timeout)
        if ok:
            return CORRECT, extracted[:_MAX_LOGGED]
        timed_out |= t
    if len(res) != 2 and not timed_out:  # text-only prediction that matched no text-only gold
        return PRED_BAD, extracted[:_MAX_LOGGED]
    return (TIMED_OUT if timed_out else WRONG), extracted[:_MAX_LOGGED]


def _equiv_task(a: str, b: str, timeout: int) -> int:
    """Symmetric equivalence of two extracted answers (verify is gold-first, so try both ways)."""
    _in_worker()
    pa, ta = _parse_gold(_gold_latex(a), timeout)
    pb, tb = _parse_gold(_gold_latex(b), timeout)
    if not pa or not pb:
        return TIMED_OUT if (ta or tb) else WRONG
    if _verify(pa, pb, timeout)[0] or _verify(pb, pa, timeout)[0]:
        return CORRECT
    return WRONG


def _extract_task(text: str, timeout: int) -> str | None:
    _in_worker()
    return _extracted(_parse(_normalize(_final_boxes(text)), _configs()[1], timeout)[0])


# --------------------------------------------------------------------------------------------
# parent side
# --------------------------------------------------------------------------------------------

_LIVE: weakref.WeakSet[MathReward] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for reward in list(_LIVE):
        reward.close()


def _default_workers() -> int:
    """CPUs this process may use, split between the Accelerate processes on this node."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, min(8, cpus // max(1, local)))


class MathReward:
    """Configurable math accuracy reward; an instance is a TRL reward function.

    Args:
        timeout: hard per-item deadline in whole seconds (math-verify only honours ints >= 1).
        workers: worker processes (default: usable CPUs / processes on this node, at most 8).
        mp_context: ``"fork"`` (default on Linux), ``"forkserver"`` or ``"spawn"``.
        log_prefix: prefix of the metrics sent through TRL's ``log_metric``.
    """

    _STAT_KEYS = ("graded", "correct", "gold_unparseable", "pred_unparseable", "timed_out", "worker_died")

    def __init__(
        self,
        timeout: int = 5,
        workers: int | None = None,
        mp_context: str | None = None,
        log_prefix: str = "math_reward",
    ):
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
            raise ValueError(f"timeout must be an integer number of seconds >= 1, got {timeout!r}")
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive integer or None, got {workers!r}")
        if mp_context is None:
            mp_context = "fork" if sys.platform.startswith("linux") else "spawn"
        if mp_context not in multiprocessing.get_all_start_methods():
            raise ValueError(f"mp_context must be one of {multiprocessing.get_all_start_methods()}, got {mp_context!r}")
        self.timeout, self.workers, self.mp_context = timeout, workers or _default_workers(), mp_context
        self.log_prefix = log_prefix
        self.__name__ = "math_accuracy"  # TRL names the reward column after this
        self._lock = threading.Lock()
        self._pool: ProcessPool | None = None
        self._pool_pid: int | None = None
        self._stats = dict.fromkeys(self._STAT_KEYS, 0)
        self._gold_cache: OrderedDict[tuple[str, ...], tuple[str, ...]] = OrderedDict()
        self._bad_golds: OrderedDict[tuple[str, ...], None] = OrderedDict()
        self._equiv_cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        _LIVE.add(self)

    # ---- lifecycle ------------------------------------------------------------------------

    def _get_pool(self) -> ProcessPool:
        with self._lock:
            if self._pool is not None and self._pool_pid == os.getpid() and self._pool.active:
                return self._pool
            if self._pool is not None and self._pool_pid == os.getpid():
                self._pool.stop()
            _configs()  # import math-verify before forking, so (re)started workers inherit it
            from math_verify.parser import get_extraction_regexes

            get_extraction_regexes(_configs()[1])  # compile math-verify's big regexes pre-fork
            ctx = multiprocessing.get_context(self.mp_context)
            self._pool, self._pool_pid = ProcessPool(max_workers=self.workers, context=ctx), os.getpid()
            return self._pool

    def close(self) -> None:
        """Stop the worker processes (idempotent). A later call restarts them."""
        with self._lock:
            pool, self._pool = self._pool, None
            if pool is not None and self._pool_pid == os.getpid():
                pool.stop()
                pool.join(timeout=5)

    def __enter__(self) -> MathReward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self):  # picklable (e.g. copied into another process): without the pool
        state = self.__dict__.copy()
        state.update(_lock=None, _pool=None, _pool_pid=None)
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

    def _run(self, fn, arglists: list[tuple]) -> list:
        """Run ``fn(*args, timeout)`` per item under the deadline; TIMED_OUT / DIED on failure.

        All items are submitted at once (workers stay busy); a worker that dies mid-item gets
        that item retried once in a fresh worker, so a crash never loses other results.
        """
        if not arglists:
            return []
        pool = self._get_pool()
        deadline = self.timeout + _GRACE
        futures = [pool.schedule(fn, args=(*a, self.timeout), timeout=deadline) for a in arglists]
        out = []
        for args, fut in zip(arglists, futures):
            for attempt in (0, 1):
                try:
                    out.append(fut.result())
                    break
                except FutureTimeout:
                    out.append(TIMED_OUT)
                    break
                except (ProcessExpired, CancelledError, RuntimeError) as e:
                    if attempt == 1:
                        logger.warning("math reward worker died twice on one item (%s); scoring 0", e)
                        out.append(DIED)
                    else:
                        fut = self._get_pool().schedule(fn, args=(*args, self.timeout), timeout=deadline)
        return out

    # ---- public API ---------------------------------------------------------------------------

    def _prepared_gold(self, gold) -> tuple[str, ...]:
        key = _gold_key(gold)
        with self._lock:
            hit = self._gold_cache.get(key)
            if hit is not None:
                self._gold_cache.move_to_end(key)
                return hit
        prepared = tuple(_gold_latex(g) for g in key)
        with self._lock:
            self._gold_cache[key] = prepared
            if len(self._gold_cache) > 4096:
                self._gold_cache.popitem(last=False)
        return prepared

    def _grade_codes(self, predictions: list[str], golds: list) -> tuple[list[int], list[str | None]]:
        if len(predictions) != len(golds):
            raise ValueError(f"got {len(predictions)} predictions but {len(golds)} gold answers")
        codes: list[int | None] = [None] * len(predictions)
        extracted: list[str | None] = [None] * len(predictions)
        todo, idx = [], []
        for i, (pred, gold) in enumerate(zip(predictions, golds)):
            key = _gold_key(gold)
            if not key or key in self._bad_golds:
                codes[i] = GOLD_BAD
            else:
                todo.append((pred if isinstance(pred, str) else _as_text(pred), self._prepared_gold(gold)))
                idx.append(i)
        for i, res in zip(idx, self._run(_grade_task, todo)):
            codes[i], extracted[i] = res if isinstance(res, tuple) else (res, None)
        new_bad = []
        with self._lock:
            s = self._stats
            for i, c in enumerate(codes):
                s["graded"] += 1
                s["correct"] += c == CORRECT
                s["gold_unparseable"] += c == GOLD_BAD
                s["pred_unparseable"] += c == PRED_BAD
                s["timed_out"] += c == TIMED_OUT
                s["worker_died"] += c == DIED
                key = _gold_key(golds[i])
                if c == GOLD_BAD and key not in self._bad_golds:
                    self._bad_golds[key] = None
                    new_bad.append(golds[i])
            while len(self._bad_golds) > 4096:
                self._bad_golds.popitem(last=False)
        for gold in new_bad:
            logger.warning("math reward: cannot parse gold answer %r; its completions get None", gold)
        return codes, extracted

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
        res = self._run(_extract_task, [(_as_text(t),) for t in texts])
        return [r if isinstance(r, str) else None for r in res]

    def __call__(self, completions, answer=None, solution=None, **kwargs) -> list[float | None]:
        """TRL reward function: gold from the ``answer`` column, else last ``\\boxed{}`` of ``solution``."""
        if answer is not None:
            golds = list(answer)
        elif solution is not None:
            golds = [self._solution_gold(s) for s in solution]
        else:
            raise ValueError(
                "math accuracy reward needs the gold answer: a dataset column named 'answer' (bare "
                "LaTeX, or a list of acceptable answers) or 'solution' (its last \\boxed{} is used). "
                "Rename yours, e.g. dataset = dataset.rename_column('final_answer', 'answer')."
            )
        if len(golds) != len(completions):
            raise ValueError(f"got {len(completions)} completions but {len(golds)} gold answers")
        codes, extracted = self._grade_codes([_as_text(c) for c in completions], golds)
        log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
        if callable(log_metric) and codes:
            n = len(codes)
            for name, code in (("timed_out", TIMED_OUT), ("pred_unparseable", PRED_BAD),
                               ("gold_unparseable", GOLD_BAD), ("worker_died", DIED)):  # fmt: skip
                log_metric(f"{self.log_prefix}/{name}", sum(c == code for c in codes) / n)
        if callable(log_extra):
            log_extra(f"{self.log_prefix}/extracted", list(extracted))
        return [None if c == GOLD_BAD else float(c == CORRECT) for c in codes]

    @staticmethod
    def _solution_gold(solution):
        """A solution text -> its last boxed answer; a solution without one is taken as the answer."""
        if isinstance(solution, (list, tuple)):
            return [MathReward._solution_gold(s) for s in solution]
        text = "" if solution is None else str(solution)
        boxed = last_boxed(text)
        return text if boxed is None else boxed


_DEFAULT: MathReward | None = None
_DEFAULT_LOCK = threading.Lock()


def _default_reward() -> MathReward:
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = MathReward()
        return _DEFAULT


def math_accuracy_reward(completions, answer=None, solution=None, **kwargs) -> list[float | None]:
    """1.0 if the completion's final answer equals the gold, else 0.0; None if the gold is unparseable.

    Uses a shared :class:`MathReward` (timeout 5 s) created on first call. See :class:`MathReward`.
    """
    return _default_reward()(completions, answer=answer, solution=solution, **kwargs)


# A boxed answer, then only closing punctuation, math delimiters, markdown bold and end tags.
_TAIL = re.compile(r"(?:\s|[.,;:!)\]$*]|\\\]|\\\)|</[A-Za-z_][\w-]*>|<\|[\w-]+\|>|<｜[^｜<>]{1,40}｜>)*")


def boxed_format_reward(completions, **kwargs) -> list[float]:
    """1.0 when the completion ends with a non-empty ``\\boxed{...}`` final answer, else 0.0.

    Rule: after the last balanced ``\\boxed{...}`` only whitespace, ``. , ; : ! ) ] * $``, ``\\]``,
    ``\\)`` and closing tags (``</answer>``, ``<|im_end|>``) may follow. Why so strict: the reward is
    meant to teach "finish with the boxed answer", not "mention a box somewhere".
    """
    out = []
    for c in completions:
        text = _as_text(c)
        ok = False
        spans = _box_spans(text)
        if spans:
            start, end = spans[-1]
            body = text[text.index("{", start) + 1 : end]
            ok = bool(body.strip()) and _TAIL.fullmatch(text, end + 1) is not None
        out.append(1.0 if ok else 0.0)
    return out
