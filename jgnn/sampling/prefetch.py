"""A background thread that runs a batch iterator ahead of its consumer, behind a bounded queue."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

_POLL_S = 0.05  # how often a blocked producer checks whether the consumer has gone


class _End:
    pass


class _Raised:
    def __init__(self, error: BaseException):
        self.error = error


class Prefetcher:
    """Iterate ``make_iterable()`` in a daemon thread, at most ``size`` items ahead of the consumer.

    Iterating yields the items in order; an exception raised by the producer is re-raised in the consumer at the
    point where the item would have come. Leaving the loop early (``break``, an error, garbage collection of the
    iterator) or calling `close` stops the thread and joins it, so no producer outlives its consumer.
    ``thread`` is the running thread (``None`` before iteration starts).
    """

    def __init__(self, make_iterable: Callable[[], Iterable[Any]], size: int = 2):
        if size < 1:
            raise ValueError(f"prefetch size must be at least 1, got {size}")
        self._make, self._size = make_iterable, size
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=size)
        self.thread: threading.Thread | None = None

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for item in self._make():
                if not self._put(item):
                    return
        except BaseException as error:  # noqa: BLE001 - every failure is handed to the consumer
            self._put(_Raised(error))
            return
        self._put(_End())

    def __iter__(self) -> Iterator[Any]:
        if self.thread is not None:
            raise RuntimeError("a Prefetcher is iterated once; make a new one for the next pass")
        self.thread = threading.Thread(target=self._produce, name="jgnn-prefetch", daemon=True)
        self.thread.start()
        try:
            while True:
                item = self._queue.get()
                if isinstance(item, _End):
                    return
                if isinstance(item, _Raised):
                    raise item.error
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop the producer and wait for its thread to end."""
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()
