"""The threads latecast's own CPU work runs on: each batch's work (the mover's gather, decode,
augment, normalize; the ``float32`` baseline's host prepare) at one intra-op thread, in
``one_thread()``, and the JPEG decoding split over latecast's own Python threads (``pool``),
each at one intra-op thread too. The caller's ``torch.get_num_threads()`` is back after
each batch, and it is what sets the number of decoding threads.

Why: torch's OpenMP threads spin-wait for each other at every op, so at 2 threads on a
2-core machine where another process keeps one core busy every CPU path ran 3-10x slower
than at one thread, at 4-8x the CPU (issue 21: CIFAR from a raw store 34k -> 4.5k images/s);
``OMP_WAIT_POLICY=PASSIVE`` avoids it but is read once, when torch loads, before latecast
can act. Python threads that wait on a lock sleep instead (``benchmarks/threads.py``).

``torch.set_num_threads`` also sets the count that threads started later begin with; it is
restored with the caller's, so only a thread whose first torch op runs while another thread
is inside ``one_thread`` starts at one.
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
    afterwards. Nested: the outer one holds. Usable as a decorator."""
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
