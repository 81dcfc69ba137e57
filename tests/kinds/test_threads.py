"""latecast's own CPU work runs at one intra-op thread and leaves the caller's count as it was
(``threads.py``; issue 21: OpenMP threads that spin-wait collapse a loaded machine)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import mover
from test_decode import SIZES, encoded, jpeg_bytes, photo

import latecast
from latecast import threads

SRC = Path(__file__).resolve().parents[2] / "src"
USER = 3  # a count the user chose, neither torch's default on 2 cores nor latecast's 1


@pytest.fixture
def user_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(USER)
    yield
    torch.set_num_threads(before)


def started_thread_count() -> int:
    """What a thread started now runs its torch ops at (torch's count for new threads)."""
    seen = []
    t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    t.start()
    t.join()
    return seen[0]


def counting(seen: list[int]):
    """An augmentation that notes the intra-op count its ops run at, inside the prepare."""

    def augment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return images.flip(2)

    return augment


@pytest.mark.parametrize("transfer", ["float32", "uint8", "resident"])
def test_a_loader_epoch_runs_at_one_thread_and_gives_the_users_count_back(user_threads, transfer):
    x = np.random.default_rng(0).integers(0, 256, (40, 8, 8, 3), dtype=np.uint8)
    ds = latecast.from_arrays(x, np.arange(40) % 4, name="noise")
    seen: list[int] = []
    for static in (False, True):
        loader = latecast.Loader(
            ds, 16, device="cpu", transfer=mover(transfer), augment=counting(seen), static=static
        )
        outside = [torch.get_num_threads() for _ in loader]  # the user's code between batches
        assert outside == [USER] * len(loader)
    assert seen == [1] * 5  # 3 batches, then 2 static ones (the partial one dropped)
    assert torch.get_num_threads() == USER and started_thread_count() == USER


def test_a_staged_step_fills_at_one_thread_and_gives_the_users_count_back(user_threads):
    x = np.random.default_rng(0).integers(0, 256, (40, 8, 8, 3), dtype=np.uint8)
    ds = latecast.from_arrays(x, np.arange(40) % 4, name="noise")
    seen: list[int] = []
    loader = latecast.Loader(
        ds, 16, device="cpu", transfer="resident", augment=counting(seen), static=True
    )
    for _ in loader.staged():
        loader.fill()  # what the CUDA graph replays; called by the user's step
        assert torch.get_num_threads() == USER
    assert seen == [1, 1]  # 2 full batches (the partial one dropped)


def test_jpeg_decoding_threads_follow_the_users_count_each_at_one_thread(user_threads):
    ds = encoded([jpeg_bytes(photo(h, w, 3, i)) for i, (h, w) in enumerate(SIZES)], SIZES)
    seen: list[int] = []
    got = [x for x, _ in latecast.Loader(ds, 8, device="cpu", augment=counting(seen))]
    assert len(got) == 1 and seen == [1]
    assert torch.get_num_threads() == USER and started_thread_count() == USER
    with threads.one_thread():  # the pool decode used: USER threads, each at one
        assert threads.count() == USER
        done = [threads.pool(USER).submit(torch.get_num_threads) for _ in range(2 * USER)]
        assert {f.result() for f in done} == {1}
    assert torch.get_num_threads() == USER and started_thread_count() == USER


def test_wrap_prepares_at_one_thread_and_gives_the_users_count_back(user_threads):
    x = torch.randint(0, 256, (4, 8, 8, 3), dtype=torch.uint8)
    seen: list[int] = []
    batches = [(x, torch.arange(4))] * 2
    for images, _ in latecast.wrap(batches, device="cpu", augment=counting(seen)):
        assert torch.get_num_threads() == USER and images.shape == (4, 3, 8, 8)
    assert seen == [1, 1]
    assert torch.get_num_threads() == USER and started_thread_count() == USER


@pytest.mark.parametrize(
    "chosen, seen",
    [({}, "- 2000"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE -"), ({"GOMP_SPINCOUNT": "5"}, "- 5")],
)
def test_the_command_line_shortens_openmp_spinning_unless_the_user_chose(chosen, seen):
    unset = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update({"PYTHONPATH": str(SRC)}, **chosen)
    code = "import os; from latecast.tools.cli import main; main(['info', 'mnist'])\n"
    code += "print(*(os.environ.get(k, '-') for k in %r))" % (unset,)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.splitlines()[-1] == seen, out.stderr[-2000:]
