"""``latecast.wrap`` over batches latecast does not hold (``ImageFolder``, memmapped tokens,
``StatefulDataLoader``): the values, the bytes, the pass-throughs and the errors."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import finished
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import latecast
from latecast.errors import BatchError, ConfigError
from latecast.loader import Loader

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> Path:
    """Two classes of lossless PNGs, 12x10, RGB: what ``ImageFolder`` reads."""
    from PIL import Image

    root, rng = tmp_path_factory.mktemp("folder"), np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (root / cls).mkdir()
        for i in range(7):
            pixels = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / cls / f"{i}.png")
    return root


def test_imagefolder_with_pil_to_tensor_equals_to_tensor_normalize(image_folder):
    """The same samples through the usual float32 pipeline and through uint8 + wrap."""
    from torchvision import datasets
    from torchvision import transforms as T

    usual = DataLoader(
        datasets.ImageFolder(image_folder, T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])),
        batch_size=4,
    )
    raw = DataLoader(datasets.ImageFolder(image_folder, T.PILToTensor()), batch_size=4)
    wrapped = latecast.wrap(raw, mean=MEAN, std=STD, device="cpu")
    assert len(wrapped) == len(raw) == 4
    n = 0
    for (x, y), (ref_x, ref_y) in zip(wrapped, usual):
        assert x.dtype == torch.float32 and x.shape == ref_x.shape == (len(y), 3, 12, 10)
        assert (x - ref_x).abs().max().item() <= 1e-6
        assert y.dtype == torch.int64 and torch.equal(y, ref_y)
        n += len(y)
    assert n == 14
    s = wrapped.stats  # uint8 pixels, labels 0/1 cross as one byte each
    assert (s.image_bytes, s.label_bytes, s.other_bytes) == (14 * 3 * 12 * 10, 14, 0)
    assert s.usual_bytes == 14 * 3 * 12 * 10 + 14 * 8  # as they arrive: uint8, int64
    assert s.h2d_bytes == 14 * 361 and s.copies == s.batches == 4


def test_values_augmentation_and_mixing_equal_the_loaders():
    """Fed the Loader's uint8 batches, wrap gives bitwise the Loader's, augmented and mixed,
    over two epochs; ``mixup_enabled = False`` (timm's switch) turns its mix off."""
    rng = np.random.default_rng(1)
    ds = latecast.from_arrays(
        rng.integers(0, 256, (70, 9, 9, 3), dtype=np.uint8), rng.integers(0, 5, 70)
    )
    aug = latecast.Augment(crop=2, flip=0.5, cutout=3)
    mix = latecast.transforms.Mix(classes=5, mixup=0.4, cutmix=1.0)
    loader = Loader(ds, 16, device="cpu", transfer="uint8", seed=4, augment=aug, mix=mix)
    source = Loader(ds, 16, device="cpu", seed=4)  # only for its order
    wrapped = latecast.wrap(
        [], mean=ds.mean, std=ds.std, device="cpu", augment=aug, seed=4, layout="NHWC", mix=mix
    )
    for epoch in range(3):
        source.set_epoch(epoch)
        wrapped.batches = [
            (ds.images[i.numpy()], ds.labels[i.numpy()]) for i in source.index_batches()
        ]
        assert wrapped.mixup_enabled is (epoch < 2)
        if epoch == 2:  # mixing off: what a Loader without it gives
            loader = Loader(ds, 16, device="cpu", transfer="uint8", seed=4, augment=aug)
            loader.set_epoch(2)
        got = list(wrapped)
        want = list(loader)
        assert len(got) == len(want) == 5 and wrapped.epoch == epoch + 1
        for (x, y), (wx, wy) in zip(got, want):
            assert torch.equal(x, wx) and torch.equal(y, wy)
            assert y.shape == ((len(x), 5) if epoch < 2 else (len(x),))
        if epoch == 1:
            wrapped.mixup_enabled = False


def test_nchw_nhwc_and_one_channel_give_the_same_images():
    x = torch.randint(0, 256, (6, 5, 7, 3), dtype=torch.uint8)  # NHWC
    nhwc = next(iter(latecast.wrap([x], mean=MEAN, std=STD, device="cpu")))
    nchw = next(iter(latecast.wrap([x.permute(0, 3, 1, 2).contiguous()], mean=MEAN, std=STD)))
    assert nhwc.shape == nchw.shape == (6, 3, 5, 7) and torch.equal(nhwc, nchw)
    gray = torch.randint(0, 256, (6, 5, 7), dtype=torch.uint8)  # MNIST's .data: (N, H, W)
    out = next(iter(latecast.wrap([gray], mean=(0.5,), std=(0.5,), fields={0: "image"})))
    assert out.shape == (6, 1, 5, 7)
    assert torch.allclose(out[:, 0], (gray / 255 - 0.5) / 0.5, atol=1e-6)
    plain = next(iter(latecast.wrap([x])))  # no mean/std: ToTensor() alone
    assert torch.allclose(plain, x.permute(0, 3, 1, 2) / 255, atol=1e-7)
    low = next(
        iter(latecast.wrap([x], mean=MEAN, std=STD, dtype=torch.bfloat16, channels_last=True))
    )
    assert low.dtype == torch.bfloat16 and low.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(low, nhwc.to(torch.bfloat16))


def test_every_form_of_batch_keeps_its_form_and_what_is_not_an_array():
    Pair = namedtuple("Pair", "image label")
    x = torch.randint(0, 256, (4, 6, 6, 3), dtype=torch.uint8)
    y, w = torch.arange(4), torch.rand(4, 2, dtype=torch.float64)
    names = ["a", "b", "c", "d"]
    batches = [
        x,
        (x, y),
        [x, y],
        Pair(x, y),
        {"image": x, "label": y, "weight": w, "path": names, "mask": y > 1},
    ]
    out = list(latecast.wrap(batches, device="cpu"))
    assert out[0].shape == (4, 3, 6, 6)
    assert type(out[1]) is tuple and type(out[2]) is list and type(out[3]) is Pair
    d = out[4]
    assert list(d) == ["image", "label", "weight", "path", "mask"]
    assert torch.equal(d["weight"], w) and d["weight"].dtype == torch.float64  # as it is
    assert d["path"] is names  # not an array: untouched
    assert d["mask"].dtype == torch.bool and torch.equal(d["mask"], y > 1)
    assert torch.equal(d["label"], y) and torch.equal(out[3].label, y)


def test_integers_cross_in_the_narrowest_dtype_and_come_out_int64():
    cases = [  # values -> bytes per value across the bus
        (torch.tensor([0, 255]), 1),
        (torch.tensor([-128, 127]), 1),
        (torch.tensor([0, 65535]), 2),
        (torch.tensor([-300, 300]), 2),
        (torch.tensor([0, 70000]), 4),
        (torch.tensor([-(2**40), 2**40]), 8),
        (np.array([3, 9], dtype=np.int16), 1),
    ]
    for values, size in cases:
        w = latecast.wrap([values], device="cpu")
        out = next(iter(w))
        assert out.dtype == torch.int64 and out.tolist() == list(np.asarray(values).tolist())
        assert w.stats.label_bytes == 2 * size, values
    out = next(iter(latecast.wrap([torch.tensor([1, 2])], fields={0: (torch.int8, torch.int16)})))
    assert out.dtype == torch.int16 and out.tolist() == [1, 2]


def nanogpt_batches(path: Path, steps: int, batch: int, block: int, seed: int = 0):
    """nanoGPT's get_batch, minus its ``astype(np.int64)``: uint16 windows of a memmap."""
    data = np.memmap(path, dtype=np.uint16, mode="r")
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        starts = rng.integers(0, len(data) - block - 1, batch)
        yield (
            np.stack([data[s : s + block] for s in starts]),
            np.stack([data[s + 1 : s + 1 + block] for s in starts]),
        )


def test_token_batches_cross_as_two_bytes_per_token(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 50257, 5000).astype(np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    steps, batch, block = 5, 8, 32
    w = latecast.wrap(
        nanogpt_batches(tmp_path / "train.bin", steps, batch, block),
        device="cpu",
        fields={0: torch.uint16, 1: torch.uint16},
    )
    ref = nanogpt_batches(tmp_path / "train.bin", steps, batch, block)
    for (x, y), (rx, ry) in zip(w, ref):
        assert x.dtype == y.dtype == torch.int64
        assert torch.equal(x, torch.from_numpy(rx.astype(np.int64)))  # nanoGPT's host widening
        assert torch.equal(y, torch.from_numpy(ry.astype(np.int64)))
    per_step = 2 * batch * block  # x and y
    s = w.stats
    assert s.label_bytes == s.h2d_bytes == steps * per_step * 2  # 2 bytes per token
    assert s.usual_bytes == steps * per_step * 2  # as they arrive (nanoGPT's own: int64, 8)
    assert s.copies == s.batches == steps  # x and y in one copy


# -- what passes through to the wrapped object ------------------------------------------


def test_len_set_epoch_sampler_batch_size_pass_through():
    data = TensorDataset(torch.arange(20))
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=0)
    dl = DataLoader(data, batch_size=3, sampler=sampler)
    w = latecast.wrap(dl, device="cpu")
    assert len(w) == len(dl) == 4 and w.batch_size == 3 and w.sampler is sampler
    w.set_epoch(5)
    assert sampler.epoch == 5 and w.epoch == 5
    assert torch.equal(torch.cat([b[0] for b in w]), torch.tensor(list(sampler)))
    assert not hasattr(w, "state_dict") and not hasattr(w, "load_state_dict")
    with pytest.raises(TypeError):
        len(latecast.wrap(x for x in [torch.zeros(1)]))


def test_stateful_dataloader_resumes_exactly_through_wrap():
    """wrap reads one batch ahead; its state is the source's after the batch it handed out,
    so a resumed StatefulDataLoader gives exactly the batches an unbroken pass would."""
    tdl = pytest.importorskip("torchdata.stateful_dataloader")
    rng = np.random.default_rng(0)
    data = TensorDataset(
        torch.from_numpy(rng.integers(0, 256, (40, 6, 6, 3), dtype=np.uint8)), torch.arange(40)
    )
    aug = latecast.Augment(crop=1, flip=0.5)

    def make():
        dl = tdl.StatefulDataLoader(
            data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0)
        )
        return latecast.wrap(dl, mean=(0.5,), std=(0.5,), device="cpu", augment=aug)

    unbroken = list(make())
    first = make()
    head = list(itertools.islice(first, 3))
    state = first.state_dict()
    assert state["position"] == 3 and state["epoch"] == 0
    resumed = make()
    resumed.load_state_dict(state)
    tail = list(resumed)
    for (x, y), (ux, uy) in zip(head + tail, unbroken):
        assert torch.equal(y, uy) and torch.equal(x, ux)
    assert len(head) + len(tail) == 10 and resumed.epoch == 1
    second = torch.cat([y for _, y in resumed])  # then a whole new epoch
    assert sorted(second.tolist()) == list(range(40)) and resumed.epoch == 2


def test_a_state_saved_at_the_last_batch_resumes_into_a_whole_new_epoch():
    """A state saved at the last batch (Lightning's epoch end) runs the source to its end
    first: torchdata resumes a state taken before its end into an empty pass."""
    tdl = pytest.importorskip("torchdata.stateful_dataloader")
    data = TensorDataset(torch.arange(10))

    def make():
        dl = tdl.StatefulDataLoader(
            data, 4, shuffle=True, generator=torch.Generator().manual_seed(0)
        )
        return latecast.wrap(dl, device="cpu")

    first = make()
    list(itertools.islice(first, len(first)))  # Lightning knows len() and stops there
    state = first.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)
    resumed = make()
    resumed.load_state_dict(state)
    again = torch.cat([b[0] for b in resumed])
    plain = make().batches  # torchdata's own, run to its end and resumed
    list(plain)
    fresh = tdl.StatefulDataLoader(data, 4, shuffle=True)
    fresh.load_state_dict(plain.state_dict())
    assert torch.equal(again, torch.cat([b[0] for b in fresh])) and resumed.epoch == 2
    assert sorted(again.tolist()) == list(range(10))


class Signalling:
    """Says which batch is out and whether it is the last, counts finished passes (as
    accelerate's ``DataLoaderShard``)."""

    def __init__(self, batches: list, sized: bool = True):
        self.batches, self.sized, self.passes = batches, sized, 0

    def __len__(self):
        if not self.sized:
            raise TypeError("no len()")
        return len(self.batches)

    def __iter__(self):
        for k, batch in enumerate(self.batches):
            self.index, self.last = k, k == len(self.batches) - 1
            yield batch
        self.passes += 1


def test_a_loaders_own_signals_are_those_of_the_batch_in_use():
    """What the source set in taking batch k + 1 is put back while batch k is out; its end
    runs when asked past the last (without ``len()``, found by reading past it, said so)."""
    batches = [torch.full((2,), k) for k in range(4)]
    for sized in (True, False):
        source = Signalling(batches, sized)
        w = latecast.wrap(source, device="cpu")
        seen = [(int(b[0]), w.index, w.last, w.passes) for b in w]
        if sized:
            assert seen == [(0, 0, False, 0), (1, 1, False, 0), (2, 2, False, 0), (3, 3, True, 0)]
        else:  # the read-ahead found the end before the last batch went out
            assert seen[-1] == (3, 3, True, 1) and seen[:3] == [(k, k, False, 0) for k in range(3)]
        assert source.passes == 1 and (w.epoch, w.position) == (1, 0)


def test_a_source_that_yields_more_than_its_len_hands_out_every_batch_counted_once():
    """A batch sampler whose ``len()`` falls short: wrap stops reading ahead at ``len()``,
    then hands out the rest, the epoch ending once, after the true last batch."""

    class Short(torch.utils.data.BatchSampler):
        def __len__(self):
            return 2

    data = TensorDataset(torch.arange(10))
    dl = DataLoader(data, batch_sampler=Short(range(10), batch_size=3, drop_last=False))
    w = latecast.wrap(dl, device="cpu")
    got, where = [], []
    for (ids,) in w:
        got.append(ids.tolist())
        where.append((w.epoch, w.position))
    assert sum(got, []) == list(range(10)) and len(got) == 4
    assert where == [(0, 1), (1, 0), (0, 3), (1, 0)]  # at len(): taken for the last, then not


def test_outputs_never_share_the_reused_buffer_and_the_ring_grows_once():
    w = latecast.wrap([(torch.full((n, 3), float(n)),) for n in (2, 2, 2, 9, 2, 2)], device="cpu")
    out = [b[0] for b in w]
    assert [o[0, 0].item() for o in out] == [2, 2, 2, 9, 2, 2]  # nothing overwritten later
    sizes = [b.numel() for b in w._ring.buffers]
    assert len(sizes) == 3 and max(sizes) == 9 * 3 * 4  # grew for the big batch, then reused


def test_one_mover_from_several_threads_gives_each_thread_its_own_batches():
    """Without its lock two threads shared a ring slot (~25 of 4,000 calls got the other's
    tensors); threads switch every microsecond here, so a race shows at once."""
    mover, wrong, interval = latecast.Mover(device="cpu"), [], sys.getswitchinterval()

    def calls(k: int) -> None:
        for i in range(2000):
            x, y = torch.full((4, 16), float(k * 10_000 + i)), torch.full((4,), k * 10_000 + i)
            out = mover((x, y))
            wrong.extend([(k, i)] * (not (torch.equal(out[0], x) and torch.equal(out[1], y))))

    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=calls, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == [] and mover.position == 4000 and mover.stats.batches == 4000


def test_rank_and_device_are_read_at_the_first_pass(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    x = torch.randint(0, 256, (8, 10, 10, 3), dtype=torch.uint8)
    aug = latecast.Augment(crop=2, flip=0.5)
    w = latecast.wrap([x], device="cpu", augment=aug)
    monkeypatch.setenv("LOCAL_RANK", "1")  # what Lightning's launcher sets, inside fit
    monkeypatch.setenv("WORLD_SIZE", "2")
    got = next(iter(w))
    assert torch.equal(got, finished(x, None, (0, 1, 0), augment=aug)[0])  # epoch 0, rank 1


# -- bad batches and arguments: one clear error naming the field --------------------------


FLOATS = (torch.rand(2, 3, 8, 8), torch.arange(2))  # ToTensor()'s images, labels
NHWC = torch.zeros(2, 8, 8, 3, dtype=torch.uint8)


@pytest.mark.parametrize(
    "batch,kwargs,match",
    [
        (
            FLOATS,
            {"fields": {0: "image"}},
            "field 0 is declared an image and must be uint8.*float32",
        ),
        (
            {"tokens": torch.tensor([1, 70000])},
            {"fields": {"tokens": torch.uint16}},
            "field 'tokens': values 1..70000 do not fit the declared torch.uint16",
        ),
        (
            {"img": torch.zeros(2, 3, 5, 4, dtype=torch.uint8)},
            {},
            "field 'img'.*ambiguous.*layout=",
        ),
        ({"img": torch.zeros(2, 5, 6, 7, dtype=torch.uint8)}, {}, "field 'img'.*neither"),
        (
            FLOATS,
            {"mean": MEAN, "std": STD},
            "no field of this batch is a uint8 image.*PILToTensor",
        ),
        ({"img": NHWC}, {"mean": (0.5, 0.5), "std": (1.0, 1.0)}, "field 'img': 3 channels"),
        ({"x": torch.rand(3)}, {"fields": {"x": torch.int16}}, "field 'x' is torch.float32"),
        ({"x": torch.arange(3)}, {"fields": {"y": torch.int16}}, "'y'.*this batch has fields 'x'"),
        ({"x": torch.zeros(3, device="meta")}, {}, "field 'x' is already on meta"),
        ("text", {}, "a batch must be a tensor"),
    ],
)
def test_bad_batches_are_one_clear_error_naming_the_field(batch, kwargs, match):
    with pytest.raises(BatchError, match=match):
        next(iter(latecast.wrap([batch], device="cpu", **kwargs)))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"fields": {"x": torch.float32}}, r"fields\['x'\]"),
        ({"fields": {"x": "picture"}}, r"fields\['x'\]"),
        ({"layout": "CHW"}, "layout must be one of auto, NHWC, NCHW"),
        ({"mean": (0.5,)}, "give both"),
        ({"mean": (0.5,), "std": (0.0,)}, "std > 0"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_bad_arguments_fail_at_once(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        latecast.wrap([], **kwargs)


# -- CUDA: the side stream and the pinned ring (skipped without a GPU) --------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_equals_cpu_under_load_with_pinned_reused_buffers():
    """Slow work on the main stream while the side stream copies ahead: every batch equals
    the CPU result (events guard the pinned slots), and the buffers are pinned."""
    rng = np.random.default_rng(0)
    batches = [
        {
            "image": rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8),
            "label": rng.integers(0, 1000, 64),
            "weight": rng.random(64, dtype=np.float32),
        }
        for _ in range(12)
    ]
    cpu = list(latecast.wrap(batches, mean=MEAN, std=STD, device="cpu"))
    w = latecast.wrap(batches, mean=MEAN, std=STD, device="cuda")
    big = torch.randn(2048, 2048, device="cuda")
    for k, (got, want) in enumerate(zip(w, cpu)):
        for _ in range(5):
            big = big @ big.T / 2048  # keep the GPU busy so copies and compute overlap
        assert got["image"].device.type == "cuda"
        assert (got["image"].cpu() - want["image"]).abs().max().item() <= 1e-6, k
        assert torch.equal(got["label"].cpu(), want["label"]), k
        assert torch.equal(got["weight"].cpu(), want["weight"]), k
    assert all(b is not None and b.is_pinned() for b in w._ring.buffers)
    assert w.stats.copies == 12 and w.stats.label_bytes == 12 * 64 * 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_passes_never_start_cuda():
    """A CPU device on a CUDA machine: the rings copy on no stream, CUDA stays unstarted."""
    code = (
        "import numpy as np, torch, latecast\n"
        "x = np.zeros((8, 6, 6, 1), np.uint8)\n"
        "list(latecast.wrap([(x, np.arange(8))], device='cpu'))\n"
        "ds = latecast.from_arrays(x, np.arange(8) % 2, classes=['a', 'b'])\n"
        "for t in ('uint8', 'prefetch'):\n"
        "    list(latecast.Loader(ds, 4, device='cpu', transfer=t))\n"
        "assert not torch.cuda.is_initialized()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
