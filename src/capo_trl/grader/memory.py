"""What a grader remembers across calls: its gold answers (prepared, known good, known bad) and verdicts.

Bounded, least recently used dropped first, safe to share between threads, picklable (without locks).
"""

from __future__ import annotations

import logging
import threading
from ..cache import LRU
from .normalize import _balanced, _gold_latex

logger = logging.getLogger("capo_trl.grader")

_PREPARED_SIZE = 4096  # distinct golds whose prepared LaTeX is kept
_KNOWN_SIZE = 16384  # golds remembered as good, and as bad


class _Locked:
    """A lock that pickling leaves out (a copy in another process gets its own)."""

    def __init__(self):
        self._lock = threading.Lock()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_lock"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


class GoldBook(_Locked):
    """Gold answers seen so far. A bad gold gets one warning, is remembered and never sent to a worker
    again; a good one (parsed once) needs no probe in later calls."""

    def __init__(self, max_gold_chars: int | None):
        super().__init__()
        self.max_gold_chars = max_gold_chars
        self._prepared = LRU(_PREPARED_SIZE)  # gold key -> (prepared alternatives, reason none is usable)
        self._bad = LRU(_KNOWN_SIZE)  # gold keys (values None)
        self._good = LRU(_KNOWN_SIZE)

    def known(self, key: tuple[str, ...]) -> tuple[bool, bool]:
        """(known bad, known good)."""
        with self._lock:
            return key in self._bad, key in self._good

    def prepared(self, key: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
        """Boxed, normalised gold alternatives and, when none is usable, the reason (rule checks)."""
        with self._lock:
            hit = self._prepared.get(key)
            if hit is not None:
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
            self._prepared.put(key, hit)
        return hit

    def mark(self, key: tuple[str, ...], gold, reason: str | None) -> None:
        """Remember a gold as good (``reason`` None) or bad; warn once per distinct bad gold."""
        with self._lock:
            table = self._good if reason is None else self._bad
            new = key not in table
            table.put(key, None)
            if reason is not None:
                self._good.pop(key, None)
        if new and reason is not None:
            shown = repr(gold) if len(repr(gold)) <= 200 else repr(gold)[:200] + f"... ({len(repr(gold))} chars)"
            logger.warning("math reward: cannot parse gold answer %s (%s); its completions get None", shown, reason)


class Verdicts(_Locked):
    """The last ``size`` entries of a verdict table (``size`` 0: none kept)."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size
        self._table = LRU(size)

    def get(self, key):
        with self._lock:
            return self._table.get(key)

    def put(self, key, value) -> None:
        if self.size:
            with self._lock:
                self._table.put(key, value)

    def __len__(self) -> int:
        return len(self._table)
