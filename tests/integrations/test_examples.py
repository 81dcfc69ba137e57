"""The examples/ programs as users run them, and latecast under Lightning's and accelerate's
launchers: 2 CPU processes (gloo). Each framework is launched once (this file is the script:
``_lightning``, ``_accelerate``), records what each rank saw; the tests read the records."""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
from _helpers import accelerate, assert_two_halves, launch, lightning_trainer, shares
from test_dropin import MEAN, STD, Streamed, end_signals, ids_data, reference, uneven_data
from test_frameworks import BATCH, N, ids_dataset
from torch.utils.data import DataLoader, TensorDataset

import latecast
from latecast.loader import Loader

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
DIGIT = 28 * 28  # bytes of one MNIST image as uint8


# -- the examples -----------------------------------------------------------------------------


def numbers(pattern: str, out: str) -> list[tuple[float, ...]]:
    """Every match of ``pattern`` in ``out``, its groups as numbers: at least one, or the
    output is shown."""
    found = [
        tuple(map(float, m)) if isinstance(m, tuple) else (float(m),)
        for m in re.findall(pattern, out)
    ]
    assert found, f"no {pattern!r} in:\n{out[-2000:]}"
    return found


def stat(line: str, name: str) -> int:
    """A count of the ``TransferStats`` printed in ``line``."""
    return int(re.search(rf"{name}=(\d+)", line)[1])


def both_ranks(out: str, batches: int, image_bytes: int) -> None:
    """A 2-rank run's closing lines, ``rank R of 2: K batches, <stats>``, from each rank: each
    took ``batches`` batches and moved ``image_bytes`` of images."""
    # two processes print to one pipe: a line of one may run on into the other's
    lines = dict(re.findall(r"rank (\d) of 2: (.*?)(?=rank \d of 2:|$)", out, re.M))
    assert sorted(lines) == ["0", "1"], out[-2000:]
    for line in lines.values():
        assert line.startswith(f"{batches} batches"), line
        assert stat(line, "image_bytes") == image_bytes, line


def accuracy(out: str, low: float) -> None:
    """Every ``test accuracy A`` line says at least ``low`` (chance is 0.1)."""
    for (value,) in numbers(r"test accuracy (\d\.\d+)", out):
        assert low <= value <= 1, out[-2000:]


def imagenet(out: str) -> None:
    for rank in (0, 1):  # the drop_last sampler leaves one out; the second loader has it
        assert f"rank {rank} epoch 0: validated 61 of 61, 1 re-made" in out, out[-2000:]


def timm(out: str) -> None:
    ((loss,),) = numbers(r"loss (\d+\.\d+);", out)
    assert math.isfinite(loss) and "(0.23% fewer: the labels)" in out, out[-2000:]


def hf_datasets(out: str) -> None:
    assert len(numbers(r"epoch \d: loss (\d+\.\d+)", out)) == 2
    pattern = r"(\d+) image bytes crossed as uint8 (\d+) as the int64"
    ((moved, usual),) = numbers(pattern, out.replace(",", ""))
    assert moved == 2 * 600 * DIGIT  # 2 epochs of 600 images, uint8 across
    assert usual == 8 * (moved + 2 * 600)  # images and labels as the int64 they arrive in


def lightning_hook(out: str) -> None:
    both_ranks(out, 1, 512 * DIGIT)  # way 2, the Loader: resident, each rank holds all 512


def accelerate_loop(out: str) -> None:
    losses = numbers(r"epoch \d: loss (\d+\.\d+)", out)
    assert len(losses) == 2 and all(math.isfinite(v) for (v,) in losses)
    both_ranks(out, 1, 512 * DIGIT)  # resident: 256 a rank an epoch, all 512 uploaded once


def fabric(out: str) -> None:
    ((value, seen),) = numbers(r"test accuracy (\d\.\d+) over (\d+) samples", out)
    assert seen == 512 and value >= 0.2, out[-2000:]  # every test sample once over 2 ranks
    both_ranks(out, 1, 256 * DIGIT)  # its half of the 512 train digits, one step


def plain(out: str) -> None:
    accuracy(out, 0.4)  # after 3 steps: 0.6-0.7
    line = re.search(r"test accuracy .*", out)[0]  # --jpeg: the files cross, decoded there
    assert (stat(line, "decoded_bytes") or stat(line, "image_bytes")) == 600 * DIGIT, line


def nanogpt(out: str) -> None:
    out = out.replace(",", "")  # 1,536 tokens
    ((loss, val, tokens),) = numbers(r"loss (\d+\.\d+) val (\d+\.\d+); (\d+) tokens", out)
    ((moved, usual),) = numbers(
        r"(\d+) bytes: 2 bytes per token where 8 as int64 would be (\d+)", out
    )
    assert math.isfinite(loss + val) and moved == 2 * tokens and usual == 8 * tokens


def steps_and_loss(out: str, steps: int) -> None:
    """``K steps, loss A -> B``: all ``steps`` ran, the loss finite and lower at the end."""
    ((ran, first, last),) = numbers(r"(\d+) steps, loss (\d+\.\d+) -> (\d+\.\d+)", out)
    assert ran == steps and math.isfinite(first + last) and last < first, out[-2000:]


def ct_segmentation(out: str) -> None:
    steps_and_loss(out, 8)  # 2 epochs of 32 slices in batches of 8
    out = out.replace(",", "")
    ((moved, usual),) = numbers(
        r"(\d+) image bytes crossed as int16 (\d+) as float32 \(2\.00x\)", out
    )
    assert moved == 2 * 32 * 64 * 64 * 2 and usual == 2 * moved  # 2 bytes a pixel, float32's 4
    assert stat(out, "label_bytes") == 2 * 32 * 64 * 64  # the masks: one byte a pixel


def speech_commands(out: str) -> None:
    steps_and_loss(out, 6)  # 2 epochs of 48 clips in batches of 16
    out = out.replace(",", "")
    pattern = r"(\d+) samples of (\d+) clips: (\d+) bytes crossed .*? (\d+) as float32"
    ((samples, clips, moved, usual),) = numbers(pattern, out)
    assert clips == 96 and 96 * 12000 <= samples <= 96 * 16000  # ragged: 0.75 to 1 s
    assert moved == 2 * samples + 8 * clips and usual == 4 * samples  # int16 and the lengths


def video_clips(out: str) -> None:
    steps_and_loss(out, 6)  # 2 epochs of 24 clips in batches of 8
    out = out.replace(",", "")
    pattern = r"(\d+) bytes crossed as uint8 (\d+) as float32 frames \(4\.00x\)"
    ((moved, usual),) = numbers(pattern, out)
    assert moved == 2 * 24 * 8 * 40 * 40 * 3 and usual == 4 * moved  # 40x40: cropped on the device


def video_files(out: str) -> None:
    steps_and_loss(out, 6)  # 2 epochs of 24 files in batches of 8
    out = out.replace(",", "")
    pattern = r"(\d+) bytes crossed as YUV 4:2:0 planes (\d+) as float32 frames \(5\.12x\)"
    ((moved, usual),) = numbers(pattern, out)
    assert moved == 2 * 24 * 6 * 40 * 40 * 3 // 2  # the 6 frames taken, 1.5 bytes a pixel
    assert usual == 4 * 2 * 24 * 6 * 32 * 32 * 3  # float32 at the size out


@dataclass(frozen=True)
class Example:
    needs: str  # the module it needs
    argv: str  # its options at tiny sizes (after the file's path)
    check: Callable[[str], None]  # what its output must show
    launcher: str = "python"  # "torchrun" or "accelerate" (`accelerate launch`): 2 CPU processes


DDP, E2, PLAIN = "--devices=2 --limit=512 --epochs=1", "--epochs=2", "--epochs=1 --min-accuracy=0"
EXAMPLES = {
    "imagenet_style.py": Example("torchvision", "--limit=240 --epochs=1", imagenet, "torchrun"),
    "timm_style.py": Example("torch", "--steps=4", timm),
    "hf_datasets.py": Example("datasets", "--limit=600", hf_datasets),
    "lightning_hook.py": Example("lightning", DDP, lightning_hook),
    "accelerate_loop.py": Example(
        "accelerate", "--limit=512 --epochs=2 --state=state", accelerate_loop, "accelerate"
    ),
    "fabric_loop.py": Example("lightning", DDP, fabric),
    "plain_loop.py": Example("torchvision", f"--limit=600 {PLAIN}", plain),
    "plain_loop.py --jpeg": Example("torchvision", f"--jpeg --limit=600 {PLAIN}", plain),
    "nanogpt_tokens.py": Example("torch", "--steps=5", nanogpt),
    "ct_segmentation.py": Example("torch", f"--slices=32 {E2}", ct_segmentation),
    "speech_commands.py": Example("torch", f"--clips=48 {E2}", speech_commands),
    "video_clips.py": Example("torch", f"--clips=24 {E2}", video_clips),
    "video_clips.py --files": Example("av", f"--files --clips=24 {E2}", video_files),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_examples_run(name, tmp_path):
    """Each (the docs' snippets are cut from them) runs at tiny sizes and says what it
    should: its accuracy, each rank's share, the bytes it saved."""
    example = EXAMPLES[name]
    pytest.importorskip(example.needs)
    path = str(ROOT / "examples" / name.split()[0])
    argv = [*(TORCHRUN if example.launcher == "torchrun" else []), path, *example.argv.split()]
    run = accelerate if example.launcher == "accelerate" else launch
    example.check(run(*argv, cwd=tmp_path).stdout)


# -- Lightning under its DDP launcher: one launch, every shape ----------------------------


@pytest.mark.slow
def test_lightning_ddp_loader_and_wrap(tmp_path):
    """One launch of ``_lightning`` on 2 processes; what each part recorded."""
    pytest.importorskip("lightning")
    launch(__file__, "lightning", tmp_path, cwd=tmp_path)
    loader_shares_checkpoint_and_one_process_equal(tmp_path)
    for how in ("fit", "datamodule"):
        wrap_gets_lightnings_sampler_and_evaluates_as_the_original(tmp_path / how)


def loader_shares_checkpoint_and_one_process_equal(out: Path) -> None:
    """The Loader built before the processes: each rank its half, every sample once an
    epoch; a resume continues exactly; the weights equal one process on both halves."""
    full, resumed = out / "full", out / "resumed"
    runs = [torch.load(full / f"rank{r}.pt") for r in range(2)]
    assert [r["built"] for r in runs] == [[0, 1], [1, 2]]  # rank 0 built it before fit
    assert [r["placed"] for r in runs] == [[0, 2], [1, 2]]
    assert_two_halves(runs, N)
    assert shares(runs, 0) != shares(runs, 1)  # a new order in the second epoch

    state = torch.load(full / "step=3.ckpt", weights_only=False)
    assert state["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["position"] == 3
    for r in range(2):
        again = torch.load(resumed / f"rank{r}.pt")
        assert again["seen"] == runs[r]["seen"][3:]  # from batch 3 of epoch 0 on
        assert torch.equal(again["weight"], runs[r]["weight"])

    loader_fit(out / "single", 1, batch=2 * BATCH)  # here: one rank, both halves a step
    one = torch.load(out / "single" / "rank0.pt")
    torch.testing.assert_close(one["weight"], runs[0]["weight"], atol=1e-6, rtol=0)


def wrap_gets_lightnings_sampler_and_evaluates_as_the_original(out: Path) -> None:
    """``fit`` of a wrapped loader or DataModule: each rank its half (once all 64 samples),
    normalized; ``validate``/``predict`` with a partial last batch score as the original."""
    how = out.name
    runs = [torch.load(out / f"rank{r}.pt") for r in range(2)]
    assert_two_halves(runs, N)
    assert shares(runs, 0) != shares(runs, 1)  # Lightning's set_epoch reached its sampler
    for r in runs:
        assert r["sampler"] == "DistributedSampler" and r["max_error"] <= 1e-6, how
        e = r["evaluated"]
        metrics, usual = e["wrapped", "validate"], e["plain", "validate"]
        assert metrics["count"] == usual["count"] == 28  # 27 and the sampler's padding
        assert metrics["loss"] == pytest.approx(usual["loss"], abs=1e-5), how
        assert e["wrapped", "predict"] == e["plain", "predict"], how
    predicted = [i for r in runs for ids, _ in r["evaluated"]["wrapped", "predict"] for i in ids]
    assert sorted(predicted) == list(range(27))  # predict's sampler pads nothing


# -- accelerate launch: one launch, every shape -------------------------------------------


@pytest.mark.slow
def test_accelerate_launch_loader_checkpoint_and_wrap(tmp_path):
    """One ``accelerate launch``: the Loader's shares whole, its position through
    ``save_state``/``load_state``; ``wrap`` of accelerate's sharded loaders stays a
    ``DataLoaderShard``, each rank its half prepared; ``gather_for_metrics`` keeps every sample
    once, last batch padded or not (once 128 of 100), unsized (once 48 of 37)."""
    pytest.importorskip("accelerate")
    accelerate(__file__, "accelerate", tmp_path, cwd=tmp_path)
    runs = [torch.load(tmp_path / f"acc{r}.pt") for r in range(2)]
    for key in ("seen", "wrapped", "prepared"):
        assert_two_halves(runs, N, key=key)
    for r in runs:
        assert r["placed"][1] == 2 and r["resumed"] == r["seen"][3:]
        assert r["wrapped_error"] <= 1e-6 and r["prepared_error"] <= 1e-6
        assert r["kind"] == "DataLoaderShard"
        assert "latecast.wrap(accelerator.prepare(dl, device_placement=[False])" in r["refused"]
        e = r["evaluated"]
        for n in (27, 32, 37):
            (signals, metric), (want, usual) = e[n, "wrapped"], e[n, "plain"]
            assert signals == want and metric == pytest.approx(usual, abs=1e-6), n
            if n != 37:  # an iterable dataset's padding accelerate keeps itself: as it does
                assert sorted(sum((ids for *_, ids in signals), [])) == list(range(n))


# -- what the launched processes run ----------------------------------------------------


def _lightning(out: Path) -> None:
    """Every Lightning shape, one trainer after another in the same 2 processes."""
    loader_fit(out / "full", 2)  # first: its Loader is built before any DDP process exists
    loader_fit(out / "resumed", 2, resume=out / "full" / "step=3.ckpt")
    for how in ("fit", "datamodule"):
        wrap_fit(out / how, how)


def loader_fit(out: Path, devices: int, resume: Path | None = None, batch: int = BATCH) -> None:
    """A latecast Loader as the train dataloader; what each rank saw and its weights."""
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
    placed, weight = [loader.rank, loader.world_size], model.net.weight.detach()
    record = dict(built=built, placed=placed, seen=model.seen, weight=weight)
    torch.save(record, out / f"rank{trainer.global_rank}.pt")


def wrap_fit(out: Path, how: str) -> None:
    """``wrap`` of a DataLoader given to ``fit`` (``how="fit"``) or by a DataModule; then the
    same weights validated and predicted through wrap and as the original loader would."""
    import lightning as L
    import torch.nn.functional as F

    out.mkdir(parents=True, exist_ok=True)
    images, data = ids_data()

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net, self.seen, self.error = torch.nn.Linear(90, N), [], 0.0

        def training_step(self, batch, batch_idx):
            x, ids = batch
            self.seen.append([self.current_epoch, ids.tolist()])
            want = reference(images[ids])
            self.error = max(self.error, (x - want).abs().max().item())
            return F.cross_entropy(self.net(x.flatten(1)), ids)

        def validation_step(self, batch, batch_idx):
            x, ids = batch
            self.log("loss", F.cross_entropy(self.net(x.flatten(1)), ids), sync_dist=True)
            self.log("count", float(len(ids)), reduce_fx="sum", sync_dist=True)

        def predict_step(self, batch, batch_idx):
            x, ids = batch
            return ids, self.net(x.flatten(1)).argmax(1)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def train():
        dl = DataLoader(data, batch_size=BATCH, shuffle=True)
        return latecast.wrap(dl, mean=MEAN, std=STD)

    val = uneven_data(27)  # 2 ranks: 14 each, one padded by the sampler, in batches [8, 6]
    floats = TensorDataset(reference(val.tensors[0]), val.tensors[1])  # ToTensor + Normalize

    class Data(L.LightningDataModule):  # as LightningCLI's examples give their data
        def train_dataloader(self):
            return train()  # made inside Lightning's hook: it records the arguments itself

        def val_dataloader(self):
            return latecast.wrap(DataLoader(val, batch_size=BATCH), mean=MEAN, std=STD)

        predict_dataloader = val_dataloader

    model = Net()
    trainer = lightning_trainer(max_epochs=2, devices=2, strategy="ddp", enable_checkpointing=False)
    if how == "fit":
        trainer.fit(model, train_dataloaders=train())
    else:
        trainer.fit(model, datamodule=Data())
    used = trainer.train_dataloader  # the loader Lightning re-made: still wrap's
    evaluated = {}  # the same weights, evaluated through wrap and as the original would
    for kind, loaders in (("wrapped", {"datamodule": Data()}), ("plain", None)):
        for run in (trainer.validate, trainer.predict):
            loaders = loaders or {"dataloaders": DataLoader(floats, batch_size=BATCH)}
            if how == "fit" and kind == "wrapped":  # the loader given to the call itself
                loaders = {"dataloaders": Data().val_dataloader()}
            got = run(model, **loaders)
            evaluated[kind, run.__name__] = (
                got[0] if run == trainer.validate else [(i.tolist(), p.tolist()) for i, p in got]
            )
    sampler = type(used.sampler).__name__
    record = dict(seen=model.seen, max_error=model.error, sampler=sampler, evaluated=evaluated)
    torch.save(record, out / f"rank{trainer.global_rank}.pt")


def _accelerate(out: Path) -> None:
    """Every accelerate shape with one ``Accelerator`` in each of the 2 processes."""
    from accelerate import Accelerator

    acc = Accelerator()
    record = {**loader_and_sharded_wrap(acc, out), **prepared_wrap(acc)}
    torch.save(record, out / f"acc{acc.process_index}.pt")
    acc.end_training()  # exiting with the gloo group alive aborted a rank now and then


def loader_and_sharded_wrap(acc, out: Path) -> dict:
    """The Loader registered for checkpointing, saved after 3 batches and loaded again; then
    ``wrap`` over ``prepare_data_loader``'s sharded loader."""
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
    placed = [loader.rank, loader.world_size]
    return dict(placed=placed, seen=seen, resumed=resumed, wrapped=got, wrapped_error=error)


def prepared_wrap(acc) -> dict:
    """``wrap`` of what ``prepare`` returns, two epochs; ``gather_for_metrics`` through it and
    through the plain loader; ``prepare`` of a wrapped loader."""
    images, data = ids_data()
    dl = DataLoader(data, batch_size=BATCH, shuffle=True)
    train = latecast.wrap(acc.prepare(dl, device_placement=[False]), mean=MEAN, std=STD)
    seen, error = [], 0.0
    for epoch in range(2):
        train.set_epoch(epoch)
        for x, ids in train:
            seen.append([epoch, ids.tolist()])
            error = max(error, (x - reference(images[ids])).abs().max().item())
    kind = next(c.__name__ for c in type(train).__mro__ if c.__module__.startswith("accel"))
    evaluated = {}  # gather_for_metrics over 2 ranks: an uneven last batch, an even one, and
    for n in (27, 32, 37):  # an IterableDataset's (its DataLoader has no len(): 48 of 37 kept)
        data = uneven_data(n) if n != 37 else Streamed(uneven_data(n))
        for how in ("wrapped", "plain"):
            dl = acc.prepare(DataLoader(data, batch_size=8), device_placement=[False])
            loader = latecast.wrap(dl, mean=MEAN, std=STD) if how == "wrapped" else dl
            evaluated[n, how] = end_signals(acc, loader, reference if how == "plain" else None)
    try:
        acc.prepare(latecast.wrap(DataLoader(data, batch_size=BATCH)))
        refused = ""
    except latecast.LatecastError as e:
        refused = str(e)
    return dict(
        prepared=seen, prepared_error=error, kind=kind, evaluated=evaluated, refused=refused
    )


if __name__ == "__main__":
    {"lightning": _lightning, "accelerate": _accelerate}[sys.argv[1]](Path(sys.argv[2]))
