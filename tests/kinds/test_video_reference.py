"""torchvision's video classification reference (references/video_classification: train.py,
presets.py) over a Kinetics-style folder of H.264 ``.mp4`` files, against the same program
converted to ``latecast.video`` as docs/dataloader.md says. Unconverted, the clips are
decoded to RGB by PyAV in the Dataset (torchvision 0.29 decodes no video: its users decode
with PyAV) and the presets' ops run on float in the DataLoader: ConvertImageDtype,
Resize((128, 171), antialias=False), flip, Normalize, RandomCrop(112) / CenterCrop(112),
then ``(C, T, H, W)``. Converted as docs/dataloader.md converts it, ``video(16, size=112,
resize=(128, 171), antialias=False)`` under ``Augment(flip=0.5)``: the Dataset hands over
the files' paths and ``latecast.video`` decodes them to YUV 4:2:0, converts to RGB,
resizes, crops, flips and normalizes on the device. Both take the clip at the start of each
file (the reference's RandomClipSampler picks one at random). Everything at half the size:
Kinetics' usual 256x340 files, the Resize and the crop halved."""

from __future__ import annotations

import sys
from pathlib import Path

import av
import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from torch.utils.data import DataLoader, Dataset

import latecast

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from synthetic_videos import kinetics_folder  # noqa: E402

MEAN, STD = (0.43216, 0.394666, 0.37645), (0.22803, 0.22145, 0.216989)  # the reference's
FRAMES, HW = 16, (128, 170)  # Kinetics' usual 256x340 frames, halved
RESIZE, CROP = (64, 85), 56  # the presets' Resize((128, 171)) and crop 112, halved
GREY = 2 / 255  # the bound: mean absolute difference, in [0, 1] units


@pytest.fixture(scope="module")
def kinetics(tmp_path_factory) -> list[tuple[Path, int]]:
    """3 classes of 2 videos of FRAMES + 4 frames of HW, listed as a folder dataset lists
    them."""
    return kinetics_folder(tmp_path_factory.mktemp("kinetics"), 6, 3, FRAMES + 4, HW)


class Kinetics(Dataset):
    """The reference's Kinetics400 sample, the clip at the file's start: uint8 ``(T, C, H,
    W)`` frames by PyAV (``rgb24``), then ``transform``; and its label."""

    def __init__(self, files: list[tuple[Path, int]], transform=None) -> None:
        self.files, self.transform = files, transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        path, label = self.files[i]
        with av.open(str(path)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        video = torch.from_numpy(np.stack(frames[:FRAMES])).permute(0, 3, 1, 2)
        return (self.transform(video) if self.transform else video), label


def to_cthw(x: torch.Tensor) -> torch.Tensor:
    return x.permute(1, 0, 2, 3)  # the reference's ConvertBCHWtoCBHW


def preset_eval() -> T.Compose:
    """VideoClassificationPresetEval: ConvertImageDtype, Resize (antialias=False, as the
    presets hard-code it), Normalize, CenterCrop."""
    ops = [T.ConvertImageDtype(torch.float32), T.Resize(RESIZE, antialias=False)]
    return T.Compose([*ops, T.Normalize(MEAN, STD), T.CenterCrop(CROP), to_cthw])


def uncropped(video: torch.Tensor, flipped: bool) -> torch.Tensor:
    """VideoClassificationPresetTrain up to its crop on a uint8 ``(T, C, H, W)`` clip:
    ConvertImageDtype, Resize (antialias=False), the flip given, Normalize."""
    x = TF.resize(TF.convert_image_dtype(video, torch.float32), list(RESIZE), antialias=False)
    return TF.normalize(TF.hflip(x) if flipped else x, MEAN, STD)


def preset_train(video: torch.Tensor, top: int, left: int, flipped: bool) -> torch.Tensor:
    """VideoClassificationPresetTrain on a uint8 ``(T, C, H, W)`` clip, its draw given: then
    RandomCrop's box."""
    return to_cthw(TF.crop(uncropped(video, flipped), top, left, CROP, CROP))


def grey(x: torch.Tensor) -> torch.Tensor:
    """Normalized ``(..., C, T, H, W)`` back to [0, 1]."""
    std, mean = (torch.tensor(v).view(3, 1, 1, 1) for v in (STD, MEAN))
    return x * std + mean


def nearest_draw(video: torch.Tensor, out: torch.Tensor) -> tuple[float, tuple]:
    """The (top, left, flipped) for which the train preset makes the clip nearest ``out``,
    with their mean absolute difference in [0, 1] units."""
    tops, lefts = range(RESIZE[0] - CROP + 1), range(RESIZE[1] - CROP + 1)
    draws = [(t, left, f) for f in (False, True) for t in tops for left in lefts]
    whole = {f: grey(to_cthw(uncropped(video, f))) for f in (False, True)}  # resized once
    near = grey(out)
    diffs = [(whole[f][..., t : t + CROP, x : x + CROP] - near).abs().mean() for t, x, f in draws]
    best = int(torch.stack(diffs).argmin())
    return diffs[best].item(), draws[best]


def tiny_r2plus1d(classes: int = 3) -> torch.nn.Module:
    """r2plus1d_18's stem in small: a (1, 7, 7) spatial conv, then a (3, 1, 1) temporal one,
    pooling, a linear head."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv3d(3, 8, (1, 7, 7), stride=(1, 2, 2), padding=(0, 3, 3), bias=False),
        torch.nn.BatchNorm3d(8),
        torch.nn.ReLU(),
        torch.nn.Conv3d(8, 8, (3, 1, 1), padding=(1, 0, 0), bias=False),
        torch.nn.BatchNorm3d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool3d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, classes),
    )


def train(batches) -> tuple[list[float], torch.nn.Module]:
    """train.py's step: SGD (lr 0.01, momentum 0.9, weight decay 1e-4), CrossEntropyLoss."""
    model, criterion = tiny_r2plus1d(), torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    losses = []
    for video, target in batches:
        loss = criterion(model(video), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


def test_the_video_reference_converted_trains_as_its_pyav_rgb_float32_pipeline(kinetics):
    """Train: every clip latecast makes is the train preset's (Resize, flip, Normalize,
    RandomCrop) under one crop and one flip, the crops varying by clip, within GREY (1.55 to
    1.71 grey levels when written, mostly swscale's rgb24 against float BT.601 arithmetic;
    latecast's resize antialiased against the presets' antialias=False: 1.57 to 2.01); a tiny
    r2plus1d trained on either side's batches gives the same losses; YUV 4:2:0 crossed, 1.5
    bytes a pixel. Eval: the eval preset's batches within GREY (1.63, 1.65), no search, and
    the trained models agree on them."""
    video = latecast.video(FRAMES, size=CROP, resize=RESIZE, antialias=False, start="start")
    options = dict(device="cpu", mean=MEAN, std=STD, fields={0: video})
    paths = DataLoader([(str(path), label) for path, label in kinetics], batch_size=3)
    wrapped = latecast.wrap(paths, augment=latecast.Augment(flip=0.5), seed=1, **options)
    ours, reference, draws = [], [], set()
    for epoch in range(2):
        wrapped.set_epoch(epoch)
        ours += list(wrapped)
    raw = Kinetics(kinetics)
    for k, (x, y) in enumerate(ours):  # batch k holds clips 3k..3k+2 (no shuffling)
        assert x.shape == (3, 3, FRAMES, CROP, CROP) and x.dtype == torch.float32
        sources = [raw[3 * (k % 2) + j] for j in range(3)]
        assert y.tolist() == [label for _, label in sources]
        batch = []
        for (clip, _), out in zip(sources, x):
            diff, draw = nearest_draw(clip, out)
            assert diff <= GREY, f"clip {out.shape}: {diff * 255:.2f} grey levels off at best"
            draws.add(draw)
            batch.append(preset_train(clip, *draw))
        reference.append((torch.stack(batch), y))
    assert {d[2] for d in draws} == {False, True} and len({d[:2] for d in draws}) > 4
    (mine, model), (theirs, ref_model) = train(ours), train(reference)
    assert abs(mine[-1] - mine[0]) > 1e-3  # it learns something
    torch.testing.assert_close(mine, theirs, atol=0.01, rtol=0)  # 4e-4 apart when written
    assert wrapped.stats.image_bytes == 2 * 6 * FRAMES * HW[0] * HW[1] * 3 // 2  # the planes
    model.eval(), ref_model.eval()
    evaluated = latecast.wrap(paths, **options)
    unconverted = DataLoader(Kinetics(kinetics, preset_eval()), batch_size=3)
    with torch.no_grad():
        for (x, y), (wx, wy) in zip(evaluated, unconverted, strict=True):
            assert x.shape == wx.shape and torch.equal(y, wy)
            assert (grey(x) - grey(wx)).abs().mean() <= GREY
            torch.testing.assert_close(model(x), ref_model(wx), atol=0.02, rtol=0)
