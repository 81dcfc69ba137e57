"""The threads latecast's own CPU work runs on: a batch's work at one intra-op thread
(``one_thread``: torch's OpenMP threads spin-wait at every op, which beside a busy process made
every CPU path slower, ``benchmarks/threads.py``), JPEG files on ``count()`` Python threads."""

from __future__ import annotations

import contextlib
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import torch

_outer = threading.local()  # .threads: the caller's count, while inside one_thread


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """The block's torch ops at one intra-op thread, the caller's count restored after (the
    outer one holds where nested). Usable as a decorator."""
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
    """The caller's ``torch.get_num_threads()``, inside ``one_thread`` too."""
    return getattr(_outer, "threads", None) or torch.get_num_threads()


@functools.lru_cache(maxsize=None)
def pool(threads: int) -> ThreadPoolExecutor:
    """``threads`` Python threads at one intra-op thread each (use it inside ``one_thread``)."""
    return ThreadPoolExecutor(threads, "latecast", torch.set_num_threads, (1,))
