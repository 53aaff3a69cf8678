"""A deduplicating work queue of PDDeployment keys, as in client-go's workqueue.

A key is processed by one worker at a time; a key added while it is processed is queued
again once the worker is done, so no change is lost and no object is reconciled twice at once.
"""

import asyncio
from collections.abc import Iterable

from pd_operator.adapters import metrics
from pd_operator.adapters.cache import ObjectKey


class WorkQueue:
    """Keys waiting to be reconciled; `get` hands each to one worker."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[ObjectKey] = asyncio.Queue()
        self._queued: set[ObjectKey] = set()
        self._active: set[ObjectKey] = set()
        self._dirty: set[ObjectKey] = set()

    def add(self, key: ObjectKey) -> None:
        """Ask for a reconcile of `key` (idempotent while it waits)."""
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)
            metrics.QUEUE_DEPTH.set(len(self._queued))

    def add_all_threadsafe(self, keys: Iterable[ObjectKey]) -> None:
        """`add` from another thread (the autoscaler runs in a worker thread), in one hand-over:
        each wake-up of the loop costs the calling thread a GIL switch, milliseconds apiece."""
        if self._loop is None:
            return  # not started: the first reconcile will read the decision anyway
        keys = list(keys)
        self._loop.call_soon_threadsafe(self._add_all, keys)

    def _add_all(self, keys: list[ObjectKey]) -> None:
        for key in keys:
            self.add(key)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Remember the loop that owns the queue."""
        self._loop = loop

    def add_after(self, key: ObjectKey, delay_seconds: float) -> None:
        """Ask for a reconcile later (a retry with backoff)."""
        asyncio.get_running_loop().call_later(delay_seconds, self.add, key)

    async def get(self) -> ObjectKey:
        """The next key; the caller must call `done(key)` when finished."""
        key = await self._queue.get()
        self._queued.discard(key)
        self._active.add(key)
        metrics.QUEUE_DEPTH.set(len(self._queued))
        return key

    def done(self, key: ObjectKey) -> None:
        """Finish `key`; requeue it when it changed meanwhile."""
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def idle(self) -> bool:
        """Nothing queued and nothing in progress."""
        return not self._queued and not self._active
