"""Math accuracy reward: math-verify in killable worker processes, with gold-answer fixes.

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
(:meth:`MathReward.batch_time_limit`).

Why fork (the default on Linux): the parent imports math-verify once and forked workers inherit
it, so a replacement worker is ready in milliseconds; with ``spawn``/``forkserver`` each worker
re-imports sympy and the caller's package (~1 s, several seconds if torch is pulled in). Workers
never touch torch, so torch's OpenMP/CUDA state in the parent is not an issue. Pass
``mp_context="forkserver"`` if your process forks badly (e.g. threads holding C-level locks).
"""

from __future__ import annotations

import atexit
import logging
import math
import multiprocessing
import os
import queue
import re
import signal
import sys
import threading
import time
import unicodedata
import weakref
from collections import OrderedDict
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool

from pebble import ProcessExpired, ProcessPool

logger = logging.getLogger(__name__)

__all__ = ["MathReward", "boxed_format_reward", "last_boxed", "math_accuracy_reward"]

# Result codes sent back by workers (plain ints: nothing sympy ever crosses the process boundary).
CORRECT, WRONG, GOLD_BAD, PRED_BAD, TIMED_OUT, DIED, OOM = 1, 0, 2, 3, 4, 5, 6
GOLD_TIMEOUT = 7  # the gold's parse hit math-verify's alarm (worker side)
KILLED = 8  # the parent's hard deadline: pebble killed the worker (parent side)
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


# Unicode math -> LaTeX. Each step is one regex pass, ``str.translate`` or NFKC: linear time.
_SUP = "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱ"
_SUB = "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₒₓₕₖₗₘₙₚₛₜᵢⱼ"
_SUP_RUN = re.compile(f"[{_SUP}]+")
_SUB_RUN = re.compile(f"[{_SUB}]+")
_SUP_ASCII = str.maketrans(_SUP, "0123456789+-=()ni")
_SUB_ASCII = str.maketrans(_SUB, "0123456789+-=()aeoxhklmnpstij")
_VULGAR = re.compile("[\u00bc-\u00be\u2150-\u215e\u2189]")  # ¼ ½ ¾ ⅐ ... ⅞ ↉ (not ⅟: no denominator)
_SLASH_FRAC = re.compile(r"(\d+)\s*[\u2044\u2215]\s*(\d+)")  # 1⁄2 (what NFKC makes of ½), 1∕2
_ROOT_TOKEN = re.compile(r"[√∛∜][ \t]*\(?|[()]")
_ROOT_ARG = re.compile(r"\d+(?:\.\d+)?|[^\W\d_]|\\[A-Za-z]+(?![A-Za-z{\[])")
_ROOT_CMD = {"√": r"\sqrt", "∛": r"\sqrt[3]", "∜": r"\sqrt[4]"}
_BRACE = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character, or a brace
_GREEK = "αβγδεζηθικλμνξπρστυφχψωΓΔΘΛΞΠΣΦΨΩ"
_GREEK_NAMES = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu",
    "nu", "xi", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega",
    "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Phi", "Psi", "Omega",
]  # fmt: skip
_SYMBOLS = str.maketrans(
    {
        "×": r"\times ", "÷": r"\div ", "·": r"\cdot ", "⋅": r"\cdot ", "∙": r"\cdot ", "−": "-",
        "∞": r"\infty ", "≤": r"\le ", "≥": r"\ge ", "⩽": r"\le ", "⩾": r"\ge ", "≠": r"\ne ",
        "±": r"\pm ", "∓": r"\mp ", "°": r"^{\circ}", "∈": r"\in ", "∉": r"\notin ", "∪": r"\cup ",
        "∩": r"\cap ", "≈": r"\approx ", "∅": r"\emptyset ", "∠": r"\angle ", "⁄": "/", "∕": "/",
        "\u200b": "", "\u200c": "", "\u200d": "", "\u2060": "", "\ufeff": "",
        **{g: f"\\{name} " for g, name in zip(_GREEK, _GREEK_NAMES)},
    }
)  # fmt: skip


def _vulgar(m: re.Match) -> str:
    num, den = unicodedata.normalize("NFKC", m.group()).split("\u2044")
    return f"\\frac{{{num}}}{{{den}}}"  # after a digit: 1\frac{1}{2} is a mixed number to math-verify


def _roots(text: str) -> str:
    """``√2`` -> ``\\sqrt{2}``, ``√(x+1)`` -> ``\\sqrt{x+1}`` (nested too), ``∛8`` -> ``\\sqrt[3]{8}``.

    One pass over the root signs and parentheses; a stack remembers which ``(`` opened a root.
    """
    out, stack, pos = [], [], 0
    for m in _ROOT_TOKEN.finditer(text):
        out.append(text[pos : m.start()])
        pos, tok = m.end(), m.group()
        if tok == "(":
            stack.append(-1)
            out.append(tok)
        elif tok == ")":
            out.append("}" if stack and stack.pop() >= 0 else ")")
        else:
            cmd = _ROOT_CMD[tok[0]]
            if tok.endswith("("):
                stack.append(len(out))
                out.append(cmd + "{")
            elif arg := _ROOT_ARG.match(text, pos):
                out.append(f"{cmd}{{{arg.group()}}}")
                pos = arg.end()
            else:  # ``√{...}`` already braced, or something we leave to math-verify
                out.append(cmd)
    out.append(text[pos:])
    for k in stack:  # a root whose ``(`` never closes: keep the parenthesis
        if k >= 0:
            out[k] = out[k][:-1] + "("
    return "".join(out)


def _unicode_math(text: str) -> str:
    """Unicode math notation -> the LaTeX math-verify reads (``½``, ``√2``, ``２``, ``x²``, ``×``...).

    A no-op for pure ASCII (checked in O(1)). Order matters: superscripts and vulgar fractions go
    before NFKC, which would flatten ``x²`` to ``x2`` and ``1½`` to ``11⁄2``.
    """
    if text.isascii():
        return text
    if _SUP_RUN.search(text):
        text = _SUP_RUN.sub(lambda m: "^{" + m.group().translate(_SUP_ASCII) + "}", text)
    if _SUB_RUN.search(text):
        text = _SUB_RUN.sub(lambda m: "_{" + m.group().translate(_SUB_ASCII) + "}", text)
    text = _VULGAR.sub(_vulgar, text)
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)  # full-width ２ ＋ ／ ｘ, no-break spaces, ...
    if "\u2044" in text or "\u2215" in text:
        text = _SLASH_FRAC.sub(r"\\frac{\1}{\2}", text)
    if "√" in text or "∛" in text or "∜" in text:
        text = _roots(text)
    return text.translate(_SYMBOLS)


def _balanced(text: str) -> bool:
    """Whether the unescaped braces of ``text`` balance (``\\frac{1}{`` does not)."""
    depth = 0
    for m in _BRACE.finditer(text):
        c = m.group()
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0



def _normalize(text: str) -> str:
    """Rewrite notations math-verify misreads; a no-op for everything else."""
    text = _unicode_math(text)
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
    g = _unicode_math(gold.strip())  # first: full-width ``＄`` or ``＼boxed`` become ASCII
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


def _init_worker(memory_limit_mb: int | None) -> None:
    """pebble initializer, run once in each new worker (after pebble's own signal set-up)."""
    # pebble's SIGTERM handler is Python code: a worker stuck in C ignores it for 3 s before pebble
    # escalates to SIGKILL, and the pool manager waits all that time. Workers hold nothing to clean.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # math-verify logs every timeout with the whole input (megabytes); our counters replace that.
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    if memory_limit_mb is not None:
        _cap_address_space(memory_limit_mb)


def _cap_address_space(memory_limit_mb: int) -> None:
    """RLIMIT_AS = what the worker inherited at fork + ``memory_limit_mb``: one item can't take the host.

    Relative, not absolute: a forked worker of a torch/CUDA process inherits gigabytes of mappings.
    Best effort: skipped where ``resource`` or ``/proc`` is missing (not Linux).
    """
    try:
        import resource

        with open("/proc/self/statm") as f:
            inherited = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = inherited + memory_limit_mb * 2**20
        for cap in (soft, hard):
            if cap != resource.RLIM_INFINITY:
                limit = min(limit, cap)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, OSError, ValueError, AttributeError):
        pass


def _parse(text: str, targets: list, timeout: int) -> tuple[list, bool]:
    """math-verify parse; returns (result, timed_out). MemoryError propagates (scored OOM)."""
    from math_verify import parse
    from math_verify.errors import TimeoutException

    try:
        res = parse(text, targets, extraction_mode="first_match", parsing_timeout=timeout, raise_on_error=True)
    except TimeoutException:  # a BaseException
        return [], True
    except MemoryError:
        raise
    except BaseException:
        return [], False
    return res, False


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
    except MemoryError:
        raise
    except BaseException:
        ok = False
    return ok, (not ok and time.monotonic() - t0 >= timeout - 0.05)


def _extracted(res: list) -> str | None:
    return res[-1] if res and isinstance(res[-1], str) else None


def _grade_task(pred: str, golds: tuple[str, ...], timeout: int) -> tuple[int, str | None]:
    """Grade one completion against its acceptable gold answers (already ``\\boxed``).

    The golds are parsed first, so any code but GOLD_BAD / GOLD_TIMEOUT / OOM says they parse.
    """
    try:
        return _grade(pred, golds, timeout)
    except MemoryError:  # over the worker's address-space cap (memory_limit_mb)
        return OOM, None


def _grade(pred: str, golds: tuple[str, ...], timeout: int) -> tuple[int, str | None]:
    parsed_golds, gold_timeout = [], False
    for g in golds:
        res, t = _parse_gold(g, timeout)
        gold_timeout |= t
        if res:
            parsed_golds.append(res)
    if not parsed_golds:
        return (GOLD_TIMEOUT if gold_timeout else GOLD_BAD), None
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
    pa, ta = _parse_gold(_gold_latex(a), timeout)
    pb, tb = _parse_gold(_gold_latex(b), timeout)
    if not pa or not pb:
        return TIMED_OUT if (ta or tb) else WRONG
    if _verify(pa, pb, timeout)[0] or _verify(pb, pa, timeout)[0]:
        return CORRECT
    return WRONG


def _extract_task(text: str, timeout: int) -> str | None:
    return _extracted(_parse(_normalize(_final_boxes(text)), _configs()[1], timeout)[0])


# --------------------------------------------------------------------------------------------
# parent side
# --------------------------------------------------------------------------------------------

_LIVE: weakref.WeakSet[MathReward] = weakref.WeakSet()

_STOP_WAIT = 5.0  # seconds a wedged pool gets to wind down (its threads are then abandoned)
_POLL = 0.05  # how often a waiting call looks at its pool
_PENDING = object()


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


def _is_int(x, low: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


class _Workers:
    """A pebble pool plus what the deadlines need: its in-flight futures and when it last progressed.

    Shared by every call (thread) that uses it, so one call's progress counts for all.
    """

    def __init__(self, workers: int, mp_context: str, memory_limit_mb: int | None):
        ctx = multiprocessing.get_context(mp_context)
        self.pool = ProcessPool(max_workers=workers, context=ctx, initializer=_init_worker, initargs=(memory_limit_mb,))
        self.pid = os.getpid()
        self.closed = False
        self._lock = threading.Lock()
        self._inflight: set = set()
        self._last_done = self._last_busy = time.monotonic()

    def submit(self, fn, args: tuple, timeout: float, callback):
        fut = self.pool.schedule(fn, args=args, timeout=timeout)
        with self._lock:
            if not self._inflight:  # idle until now: the clocks start here
                self._last_done = self._last_busy = time.monotonic()
            self._inflight.add(fut)
        fut.add_done_callback(self._done)  # outside the lock: runs at once if fut is already done
        fut.add_done_callback(callback)

    def _done(self, fut) -> None:
        with self._lock:
            self._inflight.discard(fut)
            self._last_done = self._last_busy = time.monotonic()

    def wedged(self, stall: float, idle: float) -> str | None:
        """Why the pool can no longer be trusted with its pending tasks, or None.

        pebble marked the pool broken but left tasks unfinished (a task registered while it
        aborted the others). Tasks pending but none running for ``idle`` s: lost (a worker died
        between taking a task and acknowledging it, or holds the channel lock). Nothing finished
        for ``stall`` s although each task is killed at its deadline: the result pipe is stuck.
        """
        with self._lock:
            inflight = list(self._inflight)
        if not inflight:
            return None
        if not self.pool.active:  # pebble gave the pool up (a thread died, "All workers expired")
            return f"pebble stopped the pool with {len(inflight)} task(s) unfinished"
        now = time.monotonic()
        if any(f.running() for f in inflight):
            self._last_busy = now
        if now - self._last_busy > idle:
            return f"{len(inflight)} task(s) pending but none running for {idle:.1f} s"
        if now - self._last_done > stall:
            return f"no task finished for {stall:.1f} s"
        return None

    def processes(self) -> list:
        """The live worker processes. pebble private API (written against pebble 5.2), used only
        here: [] if it moves, then shutdown() leaves the killing to pebble's own join()."""
        manager = getattr(getattr(self.pool, "_pool_manager", None), "worker_manager", None)
        workers = getattr(manager, "workers", None)
        for _ in range(10):
            try:
                return list(dict(workers).values()) if isinstance(workers, dict) else []
            except RuntimeError:  # changed size during the copy: pebble's manager thread
                continue
        return []

    def shutdown(self, wait: float = _STOP_WAIT) -> None:
        """Stop the pool whatever its state: workers SIGKILLed, futures cancelled, then up to ``wait``
        seconds for pebble's join (which reaps the workers) to finish; it goes on in the background."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        if self.pid != os.getpid():  # a forked child's copy: the workers belong to the parent
            return
        t0 = time.monotonic()
        self.pool.stop()
        manager_loop = getattr(self.pool, "_pool_manager_loop", None)
        if manager_loop is not None:
            manager_loop.join(_STOP_WAIT / 2)  # exits within ~0.1 s; then nothing else reaps or forks
        if manager_loop is None or not manager_loop.is_alive():
            procs = self.processes()
            for proc in procs:
                try:
                    os.kill(proc.pid, signal.SIGKILL)  # SIGTERM waits on the interpreter; a stopped worker ignores it
                except (OSError, TypeError):
                    pass
            for proc in procs:  # reap them now (nothing else reaps until pebble's join below)
                proc.join(max(0.0, 1.0 - (time.monotonic() - t0)))
        with self._lock:
            inflight = list(self._inflight)
        for fut in inflight:  # every call waiting on this pool moves on now (its items are retried)
            fut.cancel()
        joiner = threading.Thread(target=self._join, name="math-reward-pool-join", daemon=True)
        joiner.start()  # pebble's join reaps the workers; it can block on a wedged pipe, so bounded
        joiner.join(max(0.0, wait - (time.monotonic() - t0)) if wait else 0.0)
        if wait and joiner.is_alive():
            logger.warning("math reward: pebble pool did not stop within %.0f s; its threads are abandoned", wait)

    def _join(self) -> None:
        try:
            self.pool.join()
        except Exception as e:  # noqa: BLE001 - a broken pool raises here; it is gone either way
            logger.debug("math reward: pebble join: %r", e)


class _Batch:
    """One call: its tasks, each with a bounded wait, retried once when its worker dies or its
    pool wedges; ``on_done(batch, i, result)`` may release held items or add tasks."""

    def __init__(self, reward: MathReward, fn, arglists: list[tuple], held=(), on_done=None):
        self.reward, self.fn, self.on_done = reward, fn, on_done
        self.args: list[tuple] = []
        self.out: list = []
        self._deaths: list[int] = []  # the worker died running it (retried once)
        self._losses: list[int] = []  # its pool wedged or was stopped (retried once, in a fresh pool)
        self._token: list[int] = []  # attempt number: callbacks of earlier attempts are ignored
        self._where: list[_Workers | None] = []
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._started = False
        self.unfinished = 0
        for args in arglists:
            self.add(args)
        self._held = set(held)
        # work stops here; batch_time_limit adds the time to stop the pools still holding tasks
        self.deadline = time.monotonic() + reward.batch_time_limit(len(arglists)) - 2 * _STOP_WAIT

    def add(self, args: tuple) -> int:
        """A new task (submitted at once when the batch is running); returns its index."""
        i = len(self.args)
        self.args.append(args)
        self.out.append(_PENDING)
        self._deaths.append(0)
        self._losses.append(0)
        self._token.append(0)
        self._where.append(None)
        self.unfinished += 1
        if self._started:
            self.submit(i)
        return i

    def submit(self, i: int) -> None:
        self._token[i] += 1
        token, r = self._token[i], self.reward
        callback = lambda fut: self._queue.put((i, token, fut))  # runs in pebble's thread
        for attempt in (0, 1):
            workers = r._get_pool()
            try:
                workers.submit(self.fn, (*self.args[i], r.timeout), r.timeout + _GRACE, callback)
                self._where[i] = workers
                return
            except RuntimeError:  # "pool not active": it broke between _get_pool and schedule
                r._discard(workers, "it stopped accepting tasks")
                if attempt:
                    raise

    def finish(self, i: int, result) -> None:
        if self.out[i] is not _PENDING:
            return
        self.out[i] = result
        self._where[i] = None
        self.unfinished -= 1
        if self.on_done is not None:
            self.on_done(self, i, result)

    def run(self) -> list:
        self._started = True
        for i in range(len(self.args)):
            if i not in self._held:
                self.submit(i)
        last_check = time.monotonic()
        while self.unfinished:
            now = time.monotonic()
            if now >= self.deadline:
                self._give_up()
                break
            if now - last_check >= _POLL:
                self._check_pools()
                last_check = now
            try:
                i, token, fut = self._queue.get(timeout=max(0.0, min(_POLL, self.deadline - now)))
            except queue.Empty:
                continue
            if token == self._token[i] and self.out[i] is _PENDING:
                self._settle(i, fut)
        return self.out

    def _settle(self, i: int, fut) -> None:
        if fut.cancelled():
            return self._retry(i, self._losses, "its pool was stopped")
        try:
            result = fut.result(timeout=0)
        except FutureTimeout:  # pebble killed the worker at the hard deadline
            result = KILLED
        except MemoryError:
            result = OOM
        except ProcessExpired as e:
            return self._retry(i, self._deaths, f"worker died ({e})")
        except CancelledError:
            return self._retry(i, self._losses, "its pool was stopped")
        except BrokenProcessPool as e:  # pebble gives up a pool when an idle worker dies
            return self._retry(i, self._losses, f"pool broke ({e})")
        except Exception as e:  # noqa: BLE001 - a broken pool or a bug: never crash a training step
            return self._retry(i, self._deaths, f"{type(e).__name__}: {e}")
        self.finish(i, result)

    def _retry(self, i: int, counter: list[int], why: str) -> None:
        counter[i] += 1
        if counter[i] >= 2:
            logger.warning("math reward: an item failed twice (%s); scoring 0", why)
            self.finish(i, DIED)
        else:
            self.submit(i)

    def _check_pools(self) -> None:
        r = self.reward
        pools = {id(w): w for w, o in zip(self._where, self.out) if w is not None and o is _PENDING}
        for workers in pools.values():
            why = workers.wedged(stall=r._slot, idle=r._idle)
            if why:
                r._discard(workers, why)  # cancels its futures: their callbacks bring the retries

    def _give_up(self) -> None:
        """The call's hard deadline: stop the pools still holding its tasks; all unfinished score 0."""
        pools = {id(w): w for w, o in zip(self._where, self.out) if w is not None and o is _PENDING}
        for workers in pools.values():
            self.reward._discard(workers, "a call reached its hard deadline")
        left = [i for i, o in enumerate(self.out) if o is _PENDING]
        logger.warning("math reward: %d item(s) unfinished at the call's deadline; scoring 0", len(left))
        for i in left:
            self.out[i] = DIED
        self.unfinished = 0


class MathReward:
    """Configurable math accuracy reward; an instance is a TRL reward function.

    Args:
        timeout: hard per-item deadline in whole seconds (math-verify only honours ints >= 1).
        workers: worker processes (default: usable CPUs / processes on this node, at most 8).
        mp_context: ``"fork"`` (default on Linux), ``"forkserver"`` or ``"spawn"``.
        log_prefix: prefix of the metrics sent through TRL's ``log_metric``.
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
        log_prefix: str = "math_reward",
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
        self.log_prefix = log_prefix
        self.memory_limit_mb, self.max_gold_chars = memory_limit_mb, max_gold_chars
        self.__name__ = "math_accuracy"  # TRL names the reward column after this
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

    def __enter__(self) -> MathReward:
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
            todo.append((pred if isinstance(pred, str) else _as_text(pred), prepared))
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
                               ("gold_unparseable", GOLD_BAD), ("worker_died", DIED),
                               ("out_of_memory", OOM)):  # fmt: skip
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
