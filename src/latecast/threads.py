"""The threads latecast's own CPU work runs on: each batch's work (gather, decode, augment,
normalize) inside ``one_thread()``, at one intra-op thread; JPEG files decoded by ``count()``
Python threads (``pool``), each at one intra-op thread. torch's OpenMP threads spin-wait for
each other at every op, which beside a busy process made every CPU path slower than one
thread (``benchmarks/threads.py``, RESULTS.md); Python threads that wait sleep. For the
model's ops the ``latecast`` command sets ``GOMP_SPINCOUNT=2000`` before torch loads: an
OpenMP thread spins 2,000 times, not 300,000, before it sleeps.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import torch

_outer = threading.local()  # .threads: the caller's count, while inside one_thread
_pools: dict[int, ThreadPoolExecutor] = {}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """The block's torch ops (in this thread) at one intra-op thread; the caller's count
    afterwards. Nested: the outer one holds. Usable as a decorator. A thread whose first
    torch op runs meanwhile starts at one too (``set_num_threads`` sets that count)."""
    threads = torch.get_num_threads()
    if getattr(_outer, "threads", None) or threads == 1:
        yield
        return
    _outer.threads = threads
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        _outer.threads = None


def count() -> int:
    """The caller's ``torch.get_num_threads()``, also inside ``one_thread``: how many Python
    threads latecast splits its CPU work over."""
    return getattr(_outer, "threads", None) or torch.get_num_threads()


def pool(threads: int) -> ThreadPoolExecutor:
    """A pool of ``threads`` Python threads, each at one intra-op thread (use it inside
    ``one_thread``: the start of each of its threads sets the count there, restored at exit)."""
    if threads not in _pools:
        _pools[threads] = ThreadPoolExecutor(threads, "latecast", torch.set_num_threads, (1,))
    return _pools[threads]
