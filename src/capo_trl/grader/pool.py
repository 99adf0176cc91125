"""The worker pool: pebble processes watched by the parent, so that no call ever waits without a deadline.

A worker killed at the wrong moment (OOM killer) can lose a task or wedge pebble's pool; the parent
detects both, stops and rebuilds the pool and retries the unfinished items once.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Protocol

from pebble import ProcessExpired, ProcessPool

from .worker import _GRACE, DIED, KILLED, OOM, _init_worker

logger = logging.getLogger("capo_trl.grader")


_STOP_WAIT = 5.0  # seconds a wedged pool gets to wind down (its threads are then abandoned)
_POLL = 0.05  # how often a waiting call looks at its pool
_PENDING = object()


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


class PoolOwner(Protocol):
    """What a batch needs from the one who owns the pool (:class:`~capo_trl.grader.MathGrader`)."""

    timeout: int
    _slot: float  # longest one task can hold a worker (s)
    _idle: float  # pending with no task running for this long (s): the pool lost them

    def _get_pool(self) -> _Workers: ...

    def _discard(self, workers: _Workers, why: str) -> None: ...

    def batch_time_limit(self, n: int) -> float: ...


class _Batch:
    """One call: its tasks, each with a bounded wait, retried once when its worker dies or its
    pool wedges; ``on_done(batch, i, result)`` may release held items or add tasks."""

    def __init__(self, reward: PoolOwner, fn, arglists: list[tuple], held=(), on_done=None, extra=None,
                 size: int | None = None):
        self.reward, self.fn, self.on_done = reward, fn, on_done
        self.extra = extra or (lambda args: 0.0)  # seconds a task may run past timeout + grace, from its args
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
        size = len(arglists) if size is None else size  # the items the tasks stand for
        self.deadline = time.monotonic() + reward.batch_time_limit(size) - 2 * _STOP_WAIT

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

        def callback(fut):  # runs in pebble's thread
            self._queue.put((i, token, fut))

        for attempt in (0, 1):
            workers = r._get_pool()
            try:
                workers.submit(self.fn, (*self.args[i], r.timeout), r.timeout + _GRACE + self.extra(self.args[i]),
                               callback)
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


