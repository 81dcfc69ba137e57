"""The clip kind (``latecast.clip``): uint8 clips cross as uint8 and come out as the float32
pipeline of torchvision's video classification reference makes them (ConvertImageDtype,
flip, Normalize, RandomCrop / CenterCrop on ``(T, C, H, W)`` clips, then ``(C, T, H, W)``),
one geometric draw per clip for all its frames."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from torch.utils.data import DataLoader, Dataset

import latecast
from latecast.errors import BatchError, ConfigError

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
MEAN, STD = (0.43216, 0.394666, 0.37645), (0.22803, 0.22145, 0.216989)  # the reference's
TO = {"NTHWC": (0, 2, 3, 1), "NTCHW": (0, 1, 2, 3), "NCTHW": (1, 0, 2, 3)}  # (T, C, H, W) ->


class Videos(Dataset):
    """Kinetics400(output_format="TCHW")'s samples: uint8 ``(T, C, H, W)`` clips, already at
    the reference's resize size, and a label; ``layout`` permutes each clip, ``transform``
    runs on it in the DataLoader (the float32 pipeline's place)."""

    def __init__(self, n=6, frames=4, hw=(14, 18), layout="NTCHW", transform=None, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.clips = torch.randint(0, 256, (n, frames, 3, *hw), dtype=torch.uint8, generator=g)
        self.layout, self.transform = layout, transform

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i):
        x = self.clips[i] if self.transform else self.clips[i].permute(TO[self.layout])
        return (self.transform(x) if self.transform else x), i % 5


def to_cthw(x: torch.Tensor) -> torch.Tensor:
    return x.permute(1, 0, 2, 3)  # the reference's ConvertBCHWtoCBHW (B there is T)


def reference_eval(crop: int) -> T.Compose:
    """VideoClassificationPresetEval's ops on a ``(T, C, H, W)`` clip (its Resize done by the
    dataset: the clips come at that size)."""
    ops = [T.ConvertImageDtype(torch.float32), T.CenterCrop(crop), T.Normalize(MEAN, STD)]
    return T.Compose([*ops, to_cthw])


def reference_train(clip: torch.Tensor, top: int, left: int, flipped: bool, crop: int):
    """VideoClassificationPresetTrain's ops on a ``(T, C, H, W)`` clip, its draw given."""
    x = TF.convert_image_dtype(clip, torch.float32)
    x = TF.normalize(TF.hflip(x) if flipped else x, MEAN, STD)
    return to_cthw(TF.crop(x, top, left, crop, crop))


def float32_batches(crop: int, **kw) -> list:
    """The float32 pipeline: the transform in the DataLoader, then ``.to(device)``."""
    dl = DataLoader(Videos(transform=reference_eval(crop), **kw), batch_size=4)
    return [(x.to(CPU), y.to(CPU)) for x, y in dl]


@pytest.mark.parametrize("layout", ["NTHWC", "NTCHW", "NCTHW"])
@pytest.mark.parametrize("out", ["NCTHW", "NTCHW"])
def test_clips_from_a_dataloader_equal_the_float32_pipeline(layout, out):
    dl = DataLoader(Videos(layout=layout), batch_size=4)
    spec = latecast.clip(frames=4, layout=layout, size=10, out=out)
    got = list(latecast.wrap(dl, device="cpu", mean=MEAN, std=STD, fields={0: spec}))
    want = float32_batches(10)
    assert len(got) == len(want) == 2
    for (x, y), (wx, wy) in zip(got, want):
        wx = wx if out == "NCTHW" else wx.transpose(1, 2)  # (N, T, C, H, W)
        assert x.dtype == torch.float32 and x.shape == wx.shape and x.is_contiguous()
        torch.testing.assert_close(x, wx, atol=1e-6, rtol=0)
        assert torch.equal(y, wy)


def test_mover_and_channels_last_give_the_same_values():
    x, y = next(iter(DataLoader(Videos(), batch_size=4)))
    want = float32_batches(10)[0][0]
    spec = latecast.clip(frames=4, layout="NTCHW", size=10)
    moved, _ = latecast.Mover(device="cpu", mean=MEAN, std=STD, fields={0: spec})((x, y))
    torch.testing.assert_close(moved, want, atol=1e-6, rtol=0)
    w = latecast.wrap([(x, y)], device="cpu", mean=MEAN, std=STD, fields={0: spec},
                      channels_last=True, dtype=torch.bfloat16)  # fmt: skip
    lean, _ = next(iter(w))
    assert lean.dtype == torch.bfloat16 and lean.is_contiguous(memory_format=torch.channels_last_3d)
    torch.testing.assert_close(lean.float(), want, atol=0.02, rtol=0.01)  # bfloat16's 8 bits


def test_clips_cross_as_uint8_a_quarter_of_the_float32_pipelines_bytes():
    """Counted by the packer on both sides: uint8 clips, and the float32 pipeline's batches
    (ConvertImageDtype + Normalize at the same size in the workers) wrapped as they are."""
    same_size = T.Compose([T.ConvertImageDtype(torch.float32), T.Normalize(MEAN, STD), to_cthw])
    ours = latecast.wrap(DataLoader(Videos(), batch_size=4), device="cpu", mean=MEAN, std=STD,
                         fields={0: latecast.clip(4, "NTCHW")})  # fmt: skip
    usual = latecast.wrap(DataLoader(Videos(transform=same_size), batch_size=4), device="cpu")
    list(ours), list(usual)
    assert ours.stats.image_bytes == 6 * 4 * 3 * 14 * 18  # one byte a value
    assert usual.stats.other_bytes == 4 * ours.stats.image_bytes  # float32: 4.00x


def test_one_draw_per_clip_for_all_its_frames_as_the_image_path_draws_for_one_frame():
    """Frame ``t`` of every clip comes out as latecast's image path makes the batch of frames
    ``t`` (resized crop, crop, flip, colour jitter, cutout), drawn alike: the clip's draw is
    the images' draw, once for all of its frames."""
    clips = Videos(n=8, frames=3, hw=(12, 16)).clips.permute(0, 1, 3, 4, 2)  # (N, T, H, W, C)
    aug = latecast.Augment(resized_crop=0.3, crop=2, flip=0.5, jitter=0.4, cutout=3)
    options = dict(device="cpu", mean=MEAN, std=STD, augment=aug, seed=3)
    got = next(iter(latecast.wrap([clips], fields={0: latecast.clip(3)}, **options)))
    plain = next(iter(latecast.wrap([clips], fields={0: latecast.clip(3)}, device="cpu",
                                    mean=MEAN, std=STD)))  # fmt: skip
    assert got.shape == (8, 3, 3, 12, 16)
    for t in range(3):
        frames = next(iter(latecast.wrap([clips[:, t]], fields={0: "image"}, **options)))
        assert torch.equal(got[:, :, t], frames)
    moved = (got - plain).flatten(1).abs().amax(1) > 1e-3
    assert moved.all()  # every clip was changed by its draw


def matching_draw(clip: torch.Tensor, out: torch.Tensor, crop: int) -> tuple | None:
    """The (top, left, flipped) for which the reference's train ops make ``out`` of ``clip``,
    one for all frames, or None."""
    _, _, h, w = clip.shape
    for flipped in (False, True):
        for top in range(h - crop + 1):
            for left in range(w - crop + 1):
                ref = reference_train(clip, top, left, flipped, crop)
                if (ref - out).abs().max() <= 1e-6:
                    return top, left, flipped
    return None


def tiny_r3d(classes: int = 5) -> torch.nn.Module:
    """r3d_18's shape in small: a (3, 7, 7) stem, a 3-D basic conv, pooling, a linear head."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv3d(3, 8, (3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3), bias=False),
        torch.nn.BatchNorm3d(8),
        torch.nn.ReLU(),
        torch.nn.Conv3d(8, 8, 3, padding=1, bias=False),
        torch.nn.BatchNorm3d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool3d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, classes),
    )


def train(batches: list) -> tuple[list[float], torch.nn.Module]:
    """The reference's step: SGD (lr 0.01, momentum 0.9, weight decay 1e-4), cross-entropy."""
    model = tiny_r3d()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    losses = []
    for video, target in batches:
        loss = torch.nn.functional.cross_entropy(model(video), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def test_trains_as_the_video_classification_references_float32_pipeline():
    """Train: every clip is the reference's train ops (flip, Normalize, RandomCrop) under one
    crop and one flip for all its frames, the draws varying by clip; a tiny r3d trained on
    either pipeline's batches ends the same. Eval (CenterCrop): equal without a search."""
    videos = Videos(n=16, frames=4, hw=(14, 18))
    wrapped = latecast.wrap(DataLoader(videos, batch_size=4), device="cpu", mean=MEAN, std=STD,
                            augment=latecast.Augment(flip=0.5), seed=1,
                            fields={0: latecast.clip(4, "NTCHW", size=10)})  # fmt: skip
    ours, reference, draws = [], [], set()
    for epoch in range(2):
        wrapped.set_epoch(epoch)
        ours += list(wrapped)
    for k, (x, y) in enumerate(ours):  # batch k holds clips 4k..4k+3 (no shuffling)
        sources = videos.clips[4 * (k % 4) : 4 * (k % 4) + 4]
        found = [matching_draw(clip, out, 10) for clip, out in zip(sources, x)]
        assert None not in found, "each clip is one crop and one flip of its source, all frames"
        draws |= set(found)
        batch = [reference_train(clip, *d, crop=10) for clip, d in zip(sources, found)]
        reference.append((torch.stack(batch), y))
    assert {d[2] for d in draws} == {False, True} and len({d[:2] for d in draws}) > 4
    (mine, model), (theirs, ref_model) = train(ours), train(reference)
    assert abs(mine[-1] - mine[0]) > 1e-4  # it learns something
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5)
    model.eval(), ref_model.eval()
    evaluated = latecast.wrap(DataLoader(videos, batch_size=4), device="cpu", mean=MEAN,
                              std=STD, fields={0: latecast.clip(4, "NTCHW", size=10)})  # fmt: skip
    pairs = list(zip(evaluated, float32_batches(10, n=16), strict=True))
    with torch.no_grad():
        for (x, _), (wx, _) in pairs:
            torch.testing.assert_close(model(x), ref_model(wx), atol=1e-5, rtol=1e-5)


def clip_batch(dtype=torch.uint8, shape=(2, 4, 6, 8, 3), high=256):
    x = torch.randint(0, high, shape, generator=torch.Generator().manual_seed(0))
    x.view(-1)[0] = high - 1  # the error names the batch's range: make its top certain
    return x.to(dtype), torch.zeros(shape[0], dtype=torch.long)


@pytest.mark.parametrize(
    "batch, spec, says",
    [
        (clip_batch(torch.float32), latecast.clip(4), "must be uint8 with 5 dims, got torch.fl"),
        (clip_batch(shape=(2, 6, 8, 3)), latecast.clip(4), "5 dims, got torch.uint8 (2, 6, 8, 3)"),
        (clip_batch(), latecast.clip(8), "clips of 4 frames (NTHWC (2, 4, 6, 8, 3)), shorter"),
        (clip_batch(), latecast.clip(2), "longer than the 2 declared"),
        (clip_batch(torch.int64, high=300), latecast.clip(4), "values 0..299 do not fit uint8"),
        (clip_batch(), latecast.clip(4, size=7), "frames of 6x8 (NTHWC (2, 4, 6, 8, 3)) are sm"),
        (clip_batch(shape=(2, 4, 3, 6, 8)), latecast.clip(4, "NCTHW"), "clips of 3 frames"),
        (clip_batch(shape=(2, 4, 6, 8, 2)), latecast.clip(4), "2 channels (NTHWC (2, 4, 6, 8, 2))"),
    ],
)
def test_a_bad_batch_of_clips_is_one_batch_error_naming_the_field(batch, spec, says):
    dl = DataLoader(list(zip(*batch)), batch_size=2)
    with pytest.raises(BatchError, match=r"^field 'video'") as err:
        next(iter(latecast.wrap(({"video": x, "y": y} for x, y in dl), device="cpu", mean=MEAN,
                                std=STD, fields={"video": spec})))  # fmt: skip
    assert says in str(err.value)


@pytest.mark.parametrize("value", [[[1, 2], [3, 4]], None, "clip.mp4"], ids=["list", "None", "str"])
def test_a_clip_field_that_is_no_tensor_is_one_batch_error_naming_the_field(value):
    """A list, None or a string where clips are declared: one BatchError naming the field and
    what it was, not a raw AttributeError."""
    mover = latecast.Mover(device="cpu", fields={"video": latecast.clip(4)})
    with pytest.raises(BatchError, match=r"^field 'video' is declared clips.*got a "):
        mover({"video": value, "y": torch.zeros(2)})


@pytest.mark.parametrize("shape", [(0, 4, 6, 8, 3), (2, 0, 6, 8, 3)], ids=["empty", "0 frames"])
@pytest.mark.parametrize("augment", [None, dict(flip=0.5), dict(resized_crop=0.5)], ids=str)
def test_an_empty_batch_or_clips_of_0_frames_are_one_batch_error_naming_the_field(shape, augment):
    """A batch of no clips, or of clips of no frames: one BatchError naming the field and its
    shape, not a raw ZeroDivisionError or IndexError from the finish."""
    aug = augment and latecast.Augment(**augment)
    mover = latecast.Mover(device="cpu", augment=aug, fields={"video": latecast.clip(size=4)})
    with pytest.raises(BatchError, match=r"^field 'video': (no clips|clips of 0 frames)") as err:
        mover({"video": torch.zeros(shape, dtype=torch.uint8), "y": torch.zeros(shape[0])})
    assert f"NTHWC {shape}" in str(err.value)


@pytest.mark.parametrize(
    "layout, shape",
    [("NTHWC", (2, 4, 6, 8, 2)), ("NTHWC", (2, 4, 6, 8, 4)), ("NTCHW", (2, 4, 4, 6, 8))],
)
def test_jitter_on_clips_of_2_or_4_channels_is_one_config_error_naming_the_field(layout, shape):
    """Colour jitter takes 1 or 3 channels: on clips of 2 or 4 the error names the field and
    the clips' own shape, not the frames flattened into images."""
    mover = latecast.Mover(device="cpu", augment=latecast.Augment(jitter=0.4),
                           fields={"video": latecast.clip(4, layout)})  # fmt: skip
    with pytest.raises(ConfigError, match=r"^field 'video': colour jitter") as err:
        mover({"video": torch.zeros(shape, dtype=torch.uint8), "y": torch.zeros(2)})
    assert f"({layout} {shape})" in str(err.value)


def test_integer_clips_that_fit_cross_as_uint8():
    x, y = clip_batch(torch.int64)
    w = latecast.wrap([(x, y)], device="cpu", fields={0: latecast.clip(4)})
    got, _ = next(iter(w))
    torch.testing.assert_close(got, x.permute(0, 4, 1, 2, 3) / 255, atol=1e-6, rtol=0)
    assert w.stats.image_bytes == x.numel()


def first_batch(**options):
    return next(iter(latecast.wrap([clip_batch()], device="cpu", fields={0: latecast.clip(4)},
                                   **options)))  # fmt: skip


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda: latecast.clip(0), "latecast.clip(frames=...) must be an integer >= 1"),
        (lambda: latecast.clip(4, "THWC"), "latecast.clip(layout=...) must be one of NTHWC"),
        (lambda: latecast.clip(4, size=(0, 3)), "latecast.clip(size=...) must be an integer"),
        (lambda: latecast.clip(4, out="NCHW"), "latecast.clip(out=...) must be one of NCTHW"),
        (lambda: first_batch(erase=latecast.Erasing()), "erase= takes (N, C, H, W) images"),
        (lambda: first_batch(augment=lambda x, g: x), "augment= must be a latecast.Augment"),
    ],
)  # fmt: skip
def test_bad_declarations_and_options_are_config_errors(make, says):
    with pytest.raises(ConfigError) as err:
        make()
    assert says in str(err.value)


def test_the_benchmark_runs_and_counts_a_quarter_of_the_bytes(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'benchmarks'}"}
    args = "--clips 8 --frames 2 --size 20x24 --crop 16 --workers 0 --batch-size 4".split()
    cmd = [sys.executable, str(ROOT / "benchmarks" / "video.py"), *args]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    crossed = {r["pipeline"]: r["bytes_crossed"] for r in rows}
    assert crossed["latecast.wrap"] == 8 * 2 * 20 * 24 * 3
    assert crossed["float32, crop on the host"] == 4 * 8 * 2 * 16 * 16 * 3
    assert crossed["float32, same size"] == 4 * crossed["latecast.wrap"]


@pytest.mark.parametrize("augment", [None, dict(flip=0.5, crop=2)], ids=["eval", "train"])
def test_the_references_layout_undeclared_gives_the_batches_of_declaring_it(augment):
    """The video classification reference's ``(T, C, H, W)`` clips, batched ``(N, T, C, H, W)``,
    at its sizes (128x171 frames, 112 out): ``layout`` left out finds NTCHW (dim 2 holds the
    3 channels), the batches bit for bit those of ``layout="NTCHW"``; read as NTHWC they
    would be frames of 3x128, smaller than 112."""
    clips = torch.randint(0, 256, (2, 4, 3, 128, 171), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(5))  # fmt: skip
    batches = [(clips, torch.tensor([1, 3]))]
    options = dict(device="cpu", mean=MEAN, std=STD, seed=4,
                   augment=augment and latecast.Augment(**augment))  # fmt: skip
    for frames in (None, 4):
        got = list(latecast.wrap(batches, fields={0: latecast.clip(frames, size=112)}, **options))
        spec = latecast.clip(frames, "NTCHW", size=112)
        want = list(latecast.wrap(batches, fields={0: spec}, **options))
        assert got[0][0].shape == (2, 3, 4, 112, 112)
        assert torch.equal(got[0][0], want[0][0]) and torch.equal(got[0][1], want[0][1])
    got, _ = latecast.Mover(device="cpu", fields={0: latecast.clip(size=112)})(batches[0])
    assert torch.equal(got, latecast.Mover(device="cpu", fields={0: spec})(batches[0])[0])


@pytest.mark.parametrize(
    "shape, spec",
    [
        ((2, 3, 3, 12, 14), latecast.clip()),  # dim 1 and dim 2: 3 frames of 3 channels
        ((2, 4, 3, 12, 3), latecast.clip(size=2)),  # dim 2 and dim 4, both fit
        ((2, 3, 6, 8, 3), latecast.clip(size=3)),  # dim 1 and dim 4, both fit
    ],
)
def test_a_clip_layout_the_shape_does_not_tell_is_one_batch_error_asking_for_it(shape, spec):
    mover = latecast.Mover(device="cpu", mean=MEAN, std=STD, fields={"video": spec})
    with pytest.raises(BatchError, match=r"^field 'video': clips .* are ambiguous") as err:
        mover({"video": torch.zeros(shape, dtype=torch.uint8), "y": torch.zeros(2)})
    assert str(shape) in str(err.value) and "latecast.clip(layout=" in str(err.value)


@pytest.mark.parametrize(
    "shape, spec, layout",
    [
        ((2, 4, 6, 8, 3), latecast.clip(), "NTHWC"),  # the old default's clips
        ((2, 4, 3, 6, 8), latecast.clip(), "NTCHW"),
        ((2, 3, 4, 6, 8), latecast.clip(), "NCTHW"),
        ((2, 3, 12, 14, 3), latecast.clip(3), "NTHWC"),  # (the golden cases' clips)
        ((2, 1, 6, 8, 3), latecast.clip(1), "NTHWC"),  # one frame
    ],
)
def test_auto_finds_the_layout_a_shape_and_the_declaration_tell(shape, spec, layout):
    x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    mover = latecast.Mover(device="cpu", mean=MEAN, std=STD, fields={0: spec})
    got, _ = mover((x, torch.zeros(2)))
    declared = latecast.clip(spec.frames, layout, spec.size)
    want, _ = latecast.Mover(device="cpu", mean=MEAN, std=STD, fields={0: declared})((x, 0))
    assert torch.equal(got, want)


def test_the_bytes_saved_are_4x_at_the_same_size_and_2_29x_against_the_references_host_crop(
    tmp_path,
):
    """The benchmark at the reference's sizes (128x171 frames, 112x112 crops): uint8 frames
    cross uncropped, a quarter of float32 frames at that size, but 4 * 112 * 112 / (128 * 171)
    = 2.29x fewer than the reference's float32 pipeline, which crops in its workers; README's
    table and the fields table say both, not 4x alone."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'benchmarks'}"}
    args = "--clips 4 --frames 2 --size 128x171 --crop 112 --workers 0 --batch-size 4"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "video.py"), *args.split(), "--repeats", "1"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    crossed = {r["pipeline"]: r["bytes_crossed"] for r in rows}
    ours = crossed["latecast.wrap"]
    assert crossed["float32, same size"] / ours == 4
    host_crop = crossed["float32, crop on the host"] / ours
    assert host_crop == 4 * 112 * 112 / (128 * 171) and f"{host_crop:.2f}" == "2.29"
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| video clips"))
    assert "4x fewer than float32 frames of the same size" in row and "2.29x" in row
    fields = (ROOT / "docs" / "dataloader.md").read_text()
    row = next(line for line in fields.splitlines() if line.startswith("| video clips"))
    assert "2.29x" in row and "a quarter of the float32 frames at the same size" in row


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "bits, h, w, full, left, matrix",
    [(8, 48, 64, False, True, 5), (8, 33, 47, True, False, 1), (10, 33, 47, False, True, 1)],
)
def test_yuv_planes_made_rgb_on_cuda_equal_the_cpus(bits, h, w, full, left, matrix):
    """``latecast.video``'s device half without a decoder (the GPU machine has no PyAV to make
    files): random 4:2:0 planes, 8 and 10 bits, odd sizes, either range, BT.601 and 709, made
    RGB on CUDA as on the CPU (float32 either side: at most a level apart where a value
    rounds on its half)."""
    from latecast.kinds.encoded import BT601, MATRICES, VideoPlanes, _Clip

    g = torch.Generator().manual_seed(bits + h)
    top = 2**bits
    half = ((h + 1) // 2, (w + 1) // 2)
    planes = [torch.randint(0, top, (3, *s), generator=g) for s in [(h, w), half, half]]
    clip = _Clip((h, w), 3, None, bits=bits, full=full, left=left)
    clip.matrix = MATRICES.get(matrix, BT601)
    cpu = VideoPlanes.rgb(planes, clip)
    cuda = VideoPlanes.rgb([p.cuda() for p in planes], clip).cpu()
    diff = (cpu.int() - cuda.int()).abs()
    assert cpu.shape == (3, h, w, 3) and diff.max() <= 1 and diff.float().mean() < 0.01
