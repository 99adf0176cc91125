"""One bounded least-recently-used map, for every cache of the package (the grader's golds and
verdicts, the workers' parsed golds, the reference scores)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Any


class LRU:
    """At most ``size`` entries; a read or a write makes an entry the most recent, and the least
    recent ones are dropped beyond ``size`` (``size`` 0: nothing is kept). Picklable; not locked."""

    def __init__(self, size: int):
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}.")
        self.size = size
        self._data: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value (now the most recent entry), or ``default``."""
        if key not in self._data:
            return default
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key: Hashable, value: Any) -> None:
        """Store ``value`` as the most recent entry, dropping the least recent beyond ``size``."""
        if self.size == 0:
            return
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.size:
            self._data.popitem(last=False)

    def pop(self, key: Hashable, default: Any = None) -> Any:
        return self._data.pop(key, default)

    def clear(self) -> None:
        self._data.clear()

    def __contains__(self, key: Hashable) -> bool:  # a membership test does not refresh the entry
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[Hashable]:
        """Keys, least recent first."""
        return iter(self._data)

    def values(self):
        """Values, least recent first."""
        return self._data.values()
