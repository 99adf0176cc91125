"""What runs inside the worker processes (their main thread, so math-verify's ``signal.alarm`` works).

Results cross the process boundary as plain ints and strings: nothing sympy ever does.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from ..cache import LRU
from .normalize import _canon, _gold_latex, prepared_text

# Result codes sent back by workers (plain ints: nothing sympy ever crosses the process boundary).
CORRECT, WRONG, GOLD_BAD, PRED_BAD, TIMED_OUT, DIED, OOM = 1, 0, 2, 3, 4, 5, 6
GOLD_TIMEOUT = 7  # the gold's parse hit math-verify's alarm (worker side)
KILLED = 8  # the parent's hard deadline: pebble killed the worker (parent side)
_GRACE = 0.5  # parent deadline = timeout + grace, so math-verify's own alarm usually wins (no kill)
_MAX_LOGGED = 200  # extracted strings logged to TRL's table are cut to this many characters
_BOX_OPEN = "\\boxed{"
_CHUNK = 16  # answers of one gold per worker round trip
_CHUNK_BUDGET = 1.0  # seconds after which a chunk starts no further answer (the rest are sent again)


_CFG: tuple | None = None
_GOLD_CACHE = LRU(2048)  # (gold LaTeX, timeout) -> its parse, in this worker


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


# Typical answer shapes, parsed once in the parent before it forks workers: latex2sympy's ANTLR
# parser caches its prediction automaton as it goes (a cold parser takes ~15 ms per answer, a warm
# one ~4-6 ms), and forked workers, replacements included, inherit the warm cache.
_WARM_ATOMS = ("x", "2", "\\pi", "\\sqrt{3}", "\\frac{1}{2}", "a^2", "-5", "3.5", "\\infty", "e", "n", "\\theta",
               "10^{3}", "\\sqrt[3]{2}", "k!", "\\binom{5}{2}")  # fmt: skip
_WARM_FORMS = ("{a}", "{a}+{b}", "{a}-{b}", "{a}{b}", "\\frac{{{a}}}{{{b}}}", "\\dfrac{{{a}}}{{{b}}}", "{a}^{{{b}}}",
               "\\sqrt{{{a}}}", "({a}, {b})", "[{a}, {b})", "\\{{{a}, {b}\\}}", "{a} \\cdot {b}", "\\left({a}\\right)",
               "x = {a}", "{a} \\le x \\le {b}", "\\sin {a}", "\\cos({a})", "\\log_{{2}} {a}", "{a}^\\circ",
               "\\text{{Evelyn}}", "{a} \\text{{ cm}}", "\\begin{{pmatrix}} {a} \\\\ {b} \\end{{pmatrix}}",
               "(-\\infty, {a}] \\cup [{b}, \\infty)", "{a}, {b}", "{a}\\%", "|{a}|", "{a} \\pm {b}",
               "\\tan^{{-1}} {a}", "{a} \\times {b}")  # fmt: skip
_WARM_PAIRS = (("2x+1", "1+2x"), ("\\frac{\\sqrt{3}}{2}", "\\sin 60^\\circ"), ("(1,2)", "(2,1)"), ("3y", "y+7"),
               ("[0, 1)", "(0, 1]"), ("x = 5", "5"), ("\\{1, 2\\}", "\\{2, 1\\}"), ("\\pi/2", "1.5708"))  # fmt: skip
_WARMED: int | None = None  # the process whose parser is warm


def _warm_parser() -> None:
    """Parse the typical answer shapes once per process (~2 s), before the first fork."""
    global _WARMED
    if _WARMED == os.getpid():
        return
    _WARMED = os.getpid()
    from latex2sympy2_extended import latex2sympy  # the parser itself: no signal, no extraction

    atoms = _WARM_ATOMS
    pairs = [(atoms[i % len(atoms)], atoms[(i * 7 + 3) % len(atoms)]) for i in range(7)]
    for form in _WARM_FORMS:
        for a, b in pairs:
            try:
                latex2sympy(form.format(a=a, b=b))
            except Exception:  # noqa: BLE001 - a shape it rejects still warms the automaton
                pass
    # sympy's comparison paths import and cache on first use (~0.1 s each): take that here too
    from math_verify import parse, verify

    quiet = [(logging.getLogger(n), logging.getLogger(n).level) for n in ("math_verify", "latex2sympy2_extended")]
    for logger_, _ in quiet:
        logger_.setLevel(logging.CRITICAL)  # "timeout disabled": fine for these fixed inputs
    try:
        for a, b in _WARM_PAIRS:
            gold = parse("\\boxed{" + a + "}", _configs()[0], parsing_timeout=None)
            pred = parse("\\boxed{" + b + "}", _configs()[1], parsing_timeout=None)
            verify(gold, pred, timeout_seconds=None)
    except Exception:  # noqa: BLE001 - warming is best effort
        pass
    finally:
        for logger_, level in quiet:
            logger_.setLevel(level)


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
        return hit, False
    res, timed_out = _parse(latex, _configs()[0], timeout)
    if res and isinstance(res[-1], str) and _canon(res[-1]):
        _GOLD_CACHE.put(key, res)
        return res, False
    return [], timed_out


def _verify(gold: list, pred: list, timeout: int) -> tuple[bool, bool]:
    """Sympy comparison when both parsed; canonical string equality when the gold is text only.

    A gold that parses is compared by value alone: a prediction math-verify keeps only as text
    (a box never closed, ``\\text{...}`` around math) is not correct by its spelling.
    """
    if len(gold) == 2 and len(pred) != 2:
        return False, False
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


def _grade_task(pred: str, golds: tuple[str, ...], timeout: int, prepared: bool = False) -> tuple[int, str | None]:
    """Grade one completion against its acceptable gold answers (already ``\\boxed``).

    The golds are parsed first, so any code but GOLD_BAD / GOLD_TIMEOUT / OOM says they parse.
    ``prepared``: ``pred`` is already what math-verify reads (``_normalize(_final_boxes(text))``).
    """
    try:
        return _grade(pred, golds, timeout, prepared)
    except MemoryError:  # over the worker's address-space cap (memory_limit_mb)
        return OOM, None


def _chunk_task(preds: tuple[str, ...], golds: tuple[str, ...], budget: float, timeout: int) -> tuple:
    """Grade several prepared answers against one gold in one round trip.

    An item starts only while less than ``budget`` seconds have passed (the first always does), so
    each item gets as long as a task of its own would under the parent's deadline of
    ``budget + timeout + grace``; the items not started come back as None and are sent again.
    A gold that does not parse answers for the whole chunk.
    """
    t0, out = time.monotonic(), []
    for k, pred in enumerate(preds):
        if k and time.monotonic() - t0 >= budget:
            return (*out, *([None] * (len(preds) - k)))
        res = _grade_task(pred, golds, timeout, prepared=True)
        if res[0] in (GOLD_BAD, GOLD_TIMEOUT):
            return tuple([res] * len(preds))
        out.append(res)
    return tuple(out)


def _grade(pred: str, golds: tuple[str, ...], timeout: int, prepared: bool = False) -> tuple[int, str | None]:
    parsed_golds, gold_timeout = [], False
    for g in golds:
        res, t = _parse_gold(g, timeout)
        gold_timeout |= t
        if res:
            parsed_golds.append(res)
    if not parsed_golds:
        return (GOLD_TIMEOUT if gold_timeout else GOLD_BAD), None
    res, timed_out = _parse(pred if prepared else prepared_text(pred), _configs()[1], timeout)
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
    return _extracted(_parse(prepared_text(text), _configs()[1], timeout)[0])


