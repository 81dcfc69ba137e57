"""The packer's cost in one process, for RESULTS.md's issue 35 section (not a suite script).

Run once per revision, each with its ``src`` on ``PYTHONPATH`` (a ``git worktree`` of the
old revision), alternated:

    PYTHONPATH=OLD/src python packer_cost.py mover          # uint8 mover over MNIST
    PYTHONPATH=OLD/src python packer_cost.py jpeg STORE     # jpeg mover over a JPEG store
    PYTHONPATH=OLD/src python packer_cost.py wrap FOLDER    # wrap over 20 held batches

Prints process CPU per batch of 512 (the mover alone: no prepare stage; wrap: all of it).
"""

import pickle
import sys
import tempfile
import time
from pathlib import Path

import torch

import latecast
from latecast.transfer import MOVERS  # internal on purpose: the mover alone is timed


def timed(passes: int, run) -> float:
    run()  # warm-up (a store's first read checks CRCs)
    t = time.process_time()
    for _ in range(passes):
        run()
    return time.process_time() - t


def mover(name: str, ds, passes: int) -> str:
    m = MOVERS[name](ds, torch.device("cpu"), 512)
    idx = list(torch.randperm(len(ds), generator=torch.Generator().manual_seed(0)).split(512))

    def run():
        for _ in m.batches(idx):
            pass

    return f"{name} {timed(passes, run) / (passes * len(idx)) * 1e6:.1f} us a batch"


def wrap_held(folder: str) -> str:
    held_file = Path(tempfile.gettempdir()) / "latecast-held-batches.pkl"
    if not held_file.exists():  # the same batches for every revision
        g = torch.Generator().manual_seed(0)
        dl = torch.utils.data.DataLoader(
            latecast.jpeg_folder(folder), batch_size=512, shuffle=True, generator=g
        )
        held_file.write_bytes(pickle.dumps([b for _, b in zip(range(20), dl)]))
    held = pickle.loads(held_file.read_bytes())
    aug = latecast.Augment(crop=4, flip=0.5)
    w = latecast.wrap(held, device="cpu", mean=(0.49, 0.48, 0.45), std=(0.25, 0.24, 0.26),
                      augment=aug)  # fmt: skip

    def run():
        for _ in w:
            pass

    return f"wrap {timed(3, run) / (3 * len(held)) * 1e3:.2f} ms a batch"


if __name__ == "__main__":
    torch.set_num_threads(1)
    what = sys.argv[1]
    if what == "mover":
        print(mover("uint8", latecast.load_dataset("mnist"), 5))
    elif what == "jpeg":
        print(mover("jpeg", latecast.open_store(sys.argv[2]), 3))
    else:
        print(wrap_held(sys.argv[2]))
