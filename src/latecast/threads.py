"""The threads latecast's own CPU work runs on. Each batch's work (gather, decode, augment,
normalize; the ``float32`` baseline's host prepare) runs in ``one_thread()``: one intra-op
thread, the caller's ``torch.get_num_threads()`` back after it. JPEG files are decoded by
that many Python threads of latecast's (``pool``), each at one intra-op thread.

Why: torch's OpenMP threads spin-wait for each other at every op, so at 2 threads on 2 cores
beside a busy process every CPU path ran 3-10x slower than at one, at 4-8x the CPU (issue
21; ``benchmarks/threads.py``). Python threads that wait sleep. For the model's ops the
``latecast`` command sets ``GOMP_SPINCOUNT=2000`` (torch's libgomp reads it once, as torch
loads): a thread spins 2,000 times, not 300,000, before it sleeps, as fast as the default
on a quiet machine and as one thread beside a busy process (``PASSIVE``, no spinning, ran
``latecast train`` 1.15x slower on a quiet one; RESULTS.md).
``torch.set_num_threads`` also sets the count a thread starts with, restored with the
caller's: a thread whose first torch op runs while another is inside ``one_thread`` starts
at one.
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
