"""latecast inside the frameworks people train with: the Loader's lazy placement and epoch
state as Lightning and accelerate drive them; real 2-process runs on the CPU (gloo) under
Lightning's DDP launcher and ``accelerate launch``, every one under a timeout; the examples
run as users run them (docs/RELIABILITY.md, issue 9 rows).

Launched runs start this very file as their script (see ``_worker`` at the bottom): it
trains with the framework and only records what each rank saw.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import assert_two_halves, lightning_trainer, shares

import latecast
from latecast.loader import Loader, epoch_order
from latecast.prepare import Prepare
from latecast.transfer import float32_bytes

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 240  # seconds for one launch: a hang fails instead of blocking CI
N, BATCH = 64, 8  # per rank: 32 samples, 4 batches an epoch


def ids_dataset() -> latecast.Dataset:
    """Sample ``i`` has label ``i``: what a rank saw is read off its labels."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (N, 4, 4, 1), dtype=np.uint8)
    return latecast.from_arrays(images, np.arange(N), classes=[str(i) for i in range(N)])


def test_a_loader_built_before_the_launcher_reads_its_rank_at_the_first_pass(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    loader = Loader(ids_dataset(), BATCH, device="auto")
    assert (loader.rank, loader.world_size) == (0, 1)
    monkeypatch.setenv("LOCAL_RANK", "1")  # Lightning's launcher: LOCAL_RANK, no RANK
    monkeypatch.setenv("WORLD_SIZE", "2")
    seen = torch.cat([y for _, y in loader])
    assert (loader.rank, loader.world_size, loader.device.type) == (1, 2, "cpu")
    assert torch.equal(seen, epoch_order(N, seed=0, epoch=0, rank=1, world_size=2))  # 32 of 64


def test_the_last_batch_moves_the_loader_to_the_next_epoch():
    """Lightning knows ``len()`` and never asks for a batch after the last: the Loader's
    state must say "next epoch" once the last batch is handed out (regression: its second
    epoch under Lightning used to be empty)."""
    loader = Loader(ids_dataset(), BATCH, device="cpu")
    firsts = []
    for epoch in range(3):
        batches = list(itertools.islice(loader, len(loader)))  # never exhausts the generator
        assert len(batches) == len(loader) == 8
        assert loader.state_dict()["epoch"] == epoch + 1 and loader.position == 0
        assert sorted(torch.cat([y for _, y in batches]).tolist()) == list(range(N))
        firsts.append(batches[0][1])
    assert not torch.equal(firsts[0], firsts[1])  # a new order every epoch
    assert loader.stats.usual_bytes == float32_bytes(loader.dataset, 3 * N)


@pytest.mark.slow
def test_prepare_on_device_mixin_normalizes_and_draws_as_the_loader_would():
    """Lightning moves uint8 batches; the mixin augments them in training (seeded from seed,
    epoch, rank and Lightning's batch index), mixes them there with ``mix=``, and only
    normalizes them in validation."""
    L = pytest.importorskip("lightning")
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from latecast.lightning import PrepareOnDevice

    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (N, 6, 5, 3), dtype=np.uint8))
    mean, std, aug = (0.4, 0.5, 0.6), (0.2, 0.3, 0.25), latecast.Augment(crop=1, flip=0.5)

    class Net(PrepareOnDevice, L.LightningModule):
        def __init__(self, mix=None):
            super().__init__()
            self.prepare_on_device(mean=mean, std=std, augment=aug, seed=3, mix=mix)
            self.lin, self.trained, self.validated = torch.nn.Linear(90, N), [], []

        def training_step(self, batch, batch_idx):
            self.trained.append((self.current_epoch, batch_idx, *batch))
            return F.cross_entropy(self.lin(batch[0].flatten(1)), batch[1])

        def validation_step(self, batch, batch_idx):
            self.validated.append(batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    # NCHW, as PILToTensor() collates; uint8 labels cross as one byte
    data = TensorDataset(images.permute(0, 3, 1, 2).contiguous(), torch.arange(N).to(torch.uint8))
    net = Net()
    lightning_trainer(max_epochs=2, enable_checkpointing=False, limit_val_batches=2).fit(
        net, DataLoader(data, batch_size=16, shuffle=True), DataLoader(data, batch_size=16)
    )
    assert len(net.trained) == 8 and {e for e, *_ in net.trained} == {0, 1}
    for epoch, batch_idx, x, y in net.trained:
        assert y.dtype == torch.int64 and x.shape == (16, 3, 6, 5)
        want = Prepare(mean, std, augment=aug, seed=3)
        want.seek(epoch, 0, batch_idx)
        assert torch.equal(x, want(images[y], y)[0]), (epoch, batch_idx)
    for x, y in net.validated:
        assert torch.equal(x, latecast.normalize(images[y], mean, std))

    mix = latecast.transforms.Mix(classes=N, mixup=0.4, cutmix=1.0)
    net = Net(mix)  # in order: batch k holds samples 16k..16k+15
    lightning_trainer(max_epochs=1, enable_checkpointing=False, limit_val_batches=1).fit(
        net, DataLoader(data, batch_size=16), DataLoader(data, batch_size=16)
    )
    for _, batch_idx, x, y in net.trained:
        ids = torch.arange(16 * batch_idx, 16 * batch_idx + 16)
        want = Prepare(mean, std, augment=aug, seed=3, mix=mix)
        want.seek(0, 0, batch_idx)
        wx, wy = want(images[ids], ids)
        assert y.shape == (16, N) and torch.equal(x, wx) and torch.equal(y, wy)
    assert {tuple(y.tolist()) for _, y in net.validated} == {tuple(range(16))}  # never mixed


# -- launched runs ---------------------------------------------------------------------------


def launch(*argv, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        cwd=cwd,  # where Lightning writes lightning_logs/
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate(*argv, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``accelerate launch`` with 2 processes on the CPU: torchrun underneath, gloo."""
    return launch(
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",  # with ACCELERATE_USE_CPU: torchrun, gloo (--cpu alone runs 1 process)
        "--num_processes=2",
        "--num_machines=1",
        "--mixed_precision=no",
        "--dynamo_backend=no",
        f"--main_process_port={free_port()}",
        *argv,
        env={"ACCELERATE_USE_CPU": "1"},
        cwd=cwd,
    )


@pytest.mark.slow
def test_lightning_ddp_two_processes_shares_checkpoint_and_one_process_equal(tmp_path):
    """The Loader as Lightning's train dataloader under its DDP launcher: built before the
    processes exist, each rank takes its own half, every sample once per epoch; the
    checkpoint holds the loader's position and a resumed run continues exactly; the
    weights equal one process stepping on both halves at once."""
    pytest.importorskip("lightning")
    full, resumed, single = tmp_path / "full", tmp_path / "resumed", tmp_path / "single"
    launch(__file__, "lightning", full, 2, cwd=tmp_path)
    runs = [torch.load(full / f"rank{r}.pt") for r in range(2)]
    assert [r["built"] for r in runs] == [[0, 1], [1, 2]]  # rank 0 built it before fit
    assert [r["placed"] for r in runs] == [[0, 2], [1, 2]]
    assert_two_halves(runs, N)
    assert shares(runs, 0) != shares(runs, 1)  # a new order in the second epoch

    state = torch.load(full / "step=3.ckpt", weights_only=False)
    assert state["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["position"] == 3
    launch(__file__, "lightning", resumed, 2, full / "step=3.ckpt", cwd=tmp_path)
    for r in range(2):
        again = torch.load(resumed / f"rank{r}.pt")
        assert again["seen"] == runs[r]["seen"][3:]  # from batch 3 of epoch 0 on
        assert torch.equal(again["weight"], runs[r]["weight"])

    _lightning(single, 1, batch=2 * BATCH)  # in this process: one rank, both halves a step
    one = torch.load(single / "rank0.pt")
    torch.testing.assert_close(one["weight"], runs[0]["weight"], atol=1e-6, rtol=0)


@pytest.mark.slow
def test_accelerate_two_processes_loader_checkpoint_and_wrap(tmp_path):
    """Under ``accelerate launch``: the Loader's shares are disjoint and whole, its position
    comes back through ``save_state``/``load_state``; ``wrap`` over accelerate's own sharded
    DataLoader gives each rank its batches prepared, values equal to the reference."""
    pytest.importorskip("accelerate")
    accelerate(__file__, "accelerate", tmp_path, cwd=tmp_path)
    runs = [torch.load(tmp_path / f"acc{r}.pt") for r in range(2)]
    for key in ("seen", "wrapped"):
        assert_two_halves(runs, N, key=key)
    for r in runs:
        assert r["placed"][1] == 2 and r["resumed"] == r["seen"][3:]
        assert r["max_error"] <= 1e-6


EXAMPLES = {  # file: (the module it needs, its command line at tiny sizes)
    "lightning_hook.py": ("lightning", ["--devices=2", "--limit=512", "--epochs=1"]),
    "accelerate_loop.py": ("accelerate", ["--limit=512", "--epochs=2", "--state=state"]),
    "fabric_loop.py": ("lightning", ["--devices=2", "--limit=512", "--epochs=1"]),
    "plain_loop.py": ("torchvision", ["--limit=600", "--epochs=1", "--min-accuracy=0"]),
    "plain_loop.py --jpeg": (
        "torchvision",
        ["--jpeg", "--limit=600", "--epochs=1", "--min-accuracy=0"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("example", list(EXAMPLES))
def test_examples_run(example, tmp_path):
    """The docs' snippets are cut from these files: they run as users run them, at tiny sizes
    (the Fabric example evaluates every test sample once over its 2 ranks, and checks its own
    batch count from ``train.stats``)."""
    module, args = EXAMPLES[example]
    pytest.importorskip(module)
    path = ROOT / "examples" / example.split()[0]
    if module == "accelerate":
        out = accelerate(path, *args, cwd=tmp_path).stdout
    else:
        out = launch(path, *args, cwd=tmp_path).stdout
    lines = ["test accuracy"] if module == "torchvision" else ["rank 0 of 2", "rank 1 of 2"]
    lines += ["test accuracy 0.", "over 512 samples"] if example == "fabric_loop.py" else []
    assert all(line in out for line in lines), out[-2000:]


# -- what the launched processes run ----------------------------------------------------


def _lightning(out: Path, devices: int, resume: str | None = None, batch: int = BATCH) -> None:
    import lightning as L
    import torch.nn.functional as F
    from lightning.pytorch.callbacks import ModelCheckpoint

    out.mkdir(parents=True, exist_ok=True)
    loader = Loader(ids_dataset(), batch, device="auto")  # before any DDP process exists
    built = [loader.rank, loader.world_size]

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net, self.seen = torch.nn.Linear(16, N), []

        def training_step(self, batch, batch_idx):
            images, labels = batch
            self.seen.append([self.current_epoch, labels.tolist()])
            return F.cross_entropy(self.net(images.flatten(1)), labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    torch.manual_seed(0)
    model = Net()
    trainer = lightning_trainer(
        max_epochs=2,
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        callbacks=[ModelCheckpoint(out, "{step}", every_n_train_steps=3, save_top_k=-1)],
    )
    trainer.fit(model, loader, ckpt_path=resume)
    torch.save(
        {
            "built": built,
            "placed": [loader.rank, loader.world_size],
            "seen": model.seen,
            "weight": model.net.weight.detach(),
        },
        out / f"rank{trainer.global_rank}.pt",
    )


def _accelerate(out: Path) -> None:
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    acc = Accelerator()
    ds = ids_dataset()
    loader = Loader(ds, BATCH, device=acc.device)
    acc.register_for_checkpointing(loader)
    seen, resumed = [], []
    for epoch in range(2):
        for k, (_, labels) in enumerate(loader):
            seen.append([epoch, labels.tolist()])
            if (epoch, k) == (0, 2):
                acc.save_state(out / "state")  # after 3 batches of epoch 0
    acc.wait_for_everyone()  # rank 0 alone writes the loader's state: done before any reads
    acc.load_state(out / "state")
    for epoch in range(loader.epoch, 2):
        resumed += [[epoch, labels.tolist()] for _, labels in loader]

    images = torch.from_numpy(ds.images).permute(0, 3, 1, 2)  # as PILToTensor() gives them
    dl = DataLoader(TensorDataset(images, torch.arange(N)), batch_size=BATCH, shuffle=True)
    sharded = acc.prepare_data_loader(dl, device_placement=False)  # wrap moves it
    wrapped = latecast.wrap(sharded, mean=ds.mean, std=ds.std, layout="NCHW")  # 4x4x1: say so
    got, error = [], 0.0
    for epoch in range(2):
        wrapped.set_epoch(epoch)
        for x, ids in wrapped:
            got.append([epoch, ids.tolist()])
            want = latecast.normalize(torch.from_numpy(ds.images[ids.numpy()]), ds.mean, ds.std)
            error = max(error, (x - want).abs().max().item())
    torch.save(
        {
            "placed": [loader.rank, loader.world_size],
            "seen": seen,
            "resumed": resumed,
            "wrapped": got,
            "max_error": error,
        },
        out / f"acc{acc.process_index}.pt",
    )
    acc.end_training()  # exiting with the gloo group alive aborted a rank now and then


def _worker(argv: list[str]) -> None:
    kind, out = argv[0], Path(argv[1])
    if kind == "lightning":
        _lightning(out, int(argv[2]), argv[3] if len(argv) > 3 else None)
    else:
        _accelerate(out)


if __name__ == "__main__":
    _worker(sys.argv[1:])
