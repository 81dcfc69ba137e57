"""accelerate's ``gather_for_metrics`` through ``wrap`` under ``accelerate launch`` (2 processes
on the CPU) over an ``IterableDataset`` without ``__len__``: this very file is the script."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from _helpers import accelerate
from torch.utils.data import DataLoader, IterableDataset

import latecast

N, BATCH = 37, 8


class Unsized(IterableDataset):
    """``N`` uint8 NCHW images, sample ``i`` labelled ``i``; no ``__len__``."""

    def __iter__(self):
        g = torch.Generator().manual_seed(N)
        images = torch.randint(0, 256, (N, 3, 5, 6), dtype=torch.uint8, generator=g)
        return zip(images, torch.arange(N))


@pytest.mark.slow
def test_gather_for_metrics_over_an_unsized_iterable_dataset_on_two_processes(tmp_path):
    """Over an unsized ``IterableDataset`` on 2 processes, every batch sees the plain prepared
    loader's signals and ``gather_for_metrics`` keeps what it keeps: accelerate's own padding
    with a ``DataLoaderShard`` (48 of 37), 37 with ``dispatch_batches=True``, through wrap too."""
    pytest.importorskip("accelerate")
    accelerate(__file__, tmp_path, cwd=tmp_path)
    for rank in range(2):
        got = torch.load(tmp_path / f"gather{rank}.pt")
        for kind in ("shard", "dispatcher"):
            assert got[kind, "wrapped"] == got[kind, "plain"], (rank, kind)
        labels, signals = got["shard", "plain"]  # accelerate's own choice without a length
        assert len(labels) >= N and signals[-1][0] is True  # (1.16: all 48, remainder -1)
        labels, signals = got["dispatcher", "plain"]
        assert labels == list(range(N)) and signals[-1] == (True, N % (2 * BATCH))


def _run(out: Path) -> None:
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    got = {}
    for kind, dispatch in (("shard", None), ("dispatcher", True)):
        acc = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch))
        for how in ("plain", "wrapped"):
            dl = DataLoader(Unsized(), batch_size=BATCH)
            dl = acc.prepare(dl, device_placement=[dispatch is True])
            loader = latecast.wrap(dl, device="cpu") if how == "wrapped" else dl
            labels, signals = [], []
            for _, y in loader:
                gs = acc.gradient_state
                signals.append((gs.end_of_dataloader, gs.remainder))
                labels += acc.gather_for_metrics(y).tolist()
            got[kind, how] = labels, signals
    torch.save(got, out / f"gather{acc.process_index}.pt")
    acc.end_training()  # the gloo group alive at exit aborted a rank now and then (busy CPUs)


if __name__ == "__main__":
    _run(Path(sys.argv[1]))
