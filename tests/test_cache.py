"""capo_trl.cache.LRU: the one cache type (grader golds and verdicts, worker gold parses, reference scores)."""

import pickle

import pytest

from capo_trl.cache import LRU


def test_least_recent_goes_first_and_a_read_refreshes():
    lru = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # "a" is now the most recent
    lru.put("c", 3)
    assert list(lru) == ["a", "c"] and list(lru.values()) == [1, 3]
    assert lru.get("b") is None and lru.get("b", "missing") == "missing"


def test_membership_does_not_refresh_and_a_write_does():
    lru = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert "a" in lru
    lru.put("c", 3)  # "a" was not refreshed by the test above
    assert list(lru) == ["b", "c"]
    lru.put("b", 20)
    lru.put("d", 4)
    assert list(lru) == ["b", "d"] and lru.get("b") == 20


def test_size_zero_keeps_nothing_and_a_negative_size_is_refused():
    lru = LRU(0)
    lru.put("a", 1)
    assert len(lru) == 0
    with pytest.raises(ValueError, match="size must be >= 0"):
        LRU(-1)


def test_pop_clear_and_pickle():
    lru = LRU(3)
    for k in "abc":
        lru.put(k, k.upper())
    assert lru.pop("b") == "B" and lru.pop("b") is None
    copy = pickle.loads(pickle.dumps(lru))
    assert list(copy) == ["a", "c"] and copy.size == 3
    lru.clear()
    assert len(lru) == 0 and len(copy) == 2
