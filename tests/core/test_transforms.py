"""Augmentation: per-image parameters, determinism, and agreement with slow references."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

import latecast
from latecast import transforms
from latecast.errors import ConfigError
from latecast.transforms import (
    Augment,
    Draw,
    crop_params,
    cutout_params,
    erase,
    flip,
    flip_params,
    translate,
)


def batch(n=64, h=12, w=10, c=3, seed=0) -> torch.Tensor:
    return torch.randint(
        0, 256, (n, h, w, c), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


def gen(seed: int, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


# Every device path runs on CPU; on a CUDA machine the same tests also run there.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# ---- slow per-image references, fed the parameters the fast code draws ----------------


def ref_crop(x: torch.Tensor, padding: int, fill: str, seed: int) -> torch.Tensor:
    shifts = crop_params(x, padding, gen(seed, x.device.type))
    mode = "constant" if fill == "zero" else "reflect"
    out = []
    for img, (dy, dx) in zip(x.cpu().numpy(), (shifts + padding).tolist()):
        padded = np.pad(img, ((padding, padding), (padding, padding), (0, 0)), mode=mode)
        out.append(padded[dy : dy + x.shape[1], dx : dx + x.shape[2]])
    return torch.from_numpy(np.stack(out)).to(x.device)


def ref_flip(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    mask = flip_params(x, p, gen(seed, x.device.type))
    return torch.stack([torch.flip(img, [1]) if m else img for img, m in zip(x, mask)])


def ref_cutout(x: torch.Tensor, size: int, seed: int) -> torch.Tensor:
    centers = cutout_params(x, gen(seed, x.device.type))
    out = x.clone()
    for img, (cy, cx) in zip(out, centers.tolist()):
        y0, x0 = cy - size // 2, cx - size // 2
        img[max(y0, 0) : max(y0 + size, 0), max(x0, 0) : max(x0 + size, 0)] = 0
    return out


def both_ways(x: torch.Tensor, seed: int, op: str, value, fill: str = "zero") -> list:
    """One op of an ``Augment`` applied by it (on the CPU: copies of rows) and by its batched
    applying half (a gather or mask, what the GPU runs), each from its draw on ``gen(seed)``."""
    g = gen(seed, x.device.type)
    half = {
        "crop": lambda: translate(x, crop_params(x, value, g), fill=fill),
        "flip": lambda: flip(x, flip_params(x, value, g)),
        "cutout": lambda: erase(x, cutout_params(x, g), value),
    }[op]()
    return [Augment(**{op: value}, fill=fill)(x, gen(seed, x.device.type)), half]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padding", [1, 3, 9])
@pytest.mark.parametrize("fill", ["zero", "reflect"])
def test_crop_equals_pad_then_slice_reference(padding, fill, device):
    x = batch().to(device)
    for got in both_ways(x, 5, "crop", padding, fill):
        assert torch.equal(got, ref_crop(x, padding, fill, seed=5))


def test_reflect_padding_matches_numpy_at_the_extreme_offset():
    x = batch(n=1, h=5, w=4, c=1)
    # padding 3 on a 4-wide image: every reflected index reaches the far mirror.
    for seed in range(20):
        for got in both_ways(x, seed, "crop", 3, "reflect"):
            assert torch.equal(got, ref_crop(x, 3, "reflect", seed))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [0.3, 0.5, 1.0])
def test_flip_equals_reference(p, device):
    x = batch().to(device)
    for got in both_ways(x, 2, "flip", p):
        assert torch.equal(got, ref_flip(x, p, seed=2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("size", [1, 4, 7, 30])
def test_cutout_equals_reference(size, device):
    x = batch().to(device) | 1  # no zero pixels, so only the square is zero
    for got in both_ways(x, 3, "cutout", size):
        assert torch.equal(got, ref_cutout(x, size, seed=3))


def test_parameters_differ_per_image():
    x = batch(n=200)
    shifts = crop_params(x, 4, gen(0))
    assert len({tuple(o) for o in shifts.tolist()}) > 40  # 81 possible shifts
    assert shifts.min() == -4 and shifts.max() == 4
    # The same image repeated must come out in many different ways within one batch.
    same = x[:1].expand(200, -1, -1, -1)
    for aug in (Augment(crop=4), Augment(flip=0.5), Augment(cutout=4)):
        assert len({bytes(img.numpy()) for img in aug(same | 1, gen(1))}) > 1


def test_flip_rate_is_near_half_per_image():
    x = batch(n=4000, h=2, w=3, c=1)
    x[:, :, 0], x[:, :, 2] = 1, 2  # asymmetric, so a flip is visible
    flipped = (Augment(flip=0.5)(x, gen(9))[:, 0, 0, 0] == 2).float()
    # 4000 Bernoulli(0.5): sd of the mean 0.008, so +-0.05 is > 6 sd; 0%, 100% or one
    # decision per batch fail.
    assert abs(flipped.mean().item() - 0.5) < 0.05


def test_same_seed_same_output_other_seed_differs():
    x = batch()
    aug = Augment(crop=4, flip=0.5, cutout=4)
    assert torch.equal(aug(x, gen(7)), aug(x, gen(7)))
    assert not torch.equal(aug(x, gen(7)), aug(x, gen(8)))


def test_off_is_identity_and_shape_dtype_kept():
    x = batch()
    for off in (Augment(crop=0), Augment(flip=0.0), Augment(cutout=0), Augment()):
        assert torch.equal(off(x), x)
    y = Augment(crop=2, flip=0.5, cutout=3, fill="reflect")(x, gen(0))
    assert y.shape == x.shape and y.dtype == torch.uint8


def test_augment_applies_crop_then_flip_then_cutout():
    x = batch()
    g = gen(4)
    expected = translate(x, crop_params(x, 2, g))
    expected = flip(expected, flip_params(expected, 0.5, g))
    expected = erase(expected, cutout_params(expected, g), 5)
    assert torch.equal(Augment(crop=2, flip=0.5, cutout=5)(x, gen(4)), expected)


@pytest.mark.parametrize(
    "bad",
    [
        torch.zeros(2, 8, 8, 3),
        torch.zeros(8, 8, 3, dtype=torch.uint8),
        np.zeros((2, 8, 8, 3), np.uint8),
    ],
)
def test_bad_input_names_expected_and_received(bad):
    for aug in (Augment(crop=2), Augment(flip=0.5), Augment(cutout=2)):
        with pytest.raises(
            ConfigError, match=r"Augment expects a uint8 tensor \(N, H, W, C\), got"
        ):
            aug(bad)


def test_bad_settings_rejected():
    x = batch(h=4, w=4)
    with pytest.raises(ConfigError, match="needs padding < 4"):
        Augment(crop=4, fill="reflect")(x)
    with pytest.raises(ConfigError, match="fill must be one of zero, reflect, got 'edge'"):
        translate(x, crop_params(x, 1), fill="edge")
    with pytest.raises(ConfigError, match="flip must be a number >= 0 and <= 1, got 1.5"):
        Augment(flip=1.5)
    with pytest.raises(ConfigError, match="cutout must be an integer >= 0, got -1"):
        Augment(cutout=-1)
    bad = ({"crop": -1}, {"flip": True}, {"cutout": 2.0}, {"fill": "wrap"}, {"altflip": 1})
    odd = ({"jitter": float("nan")}, {"resized_crop": float("inf")})
    for kwargs in (*bad, *odd, {"fill": np.array(["zero", "reflect"])}):  # no numpy ValueError
        with pytest.raises(ConfigError, match=f"{next(iter(kwargs))} must be"):
            Augment(**kwargs)


def test_a_batch_is_checked_where_it_comes_in_not_in_every_transform(monkeypatch):
    """The Loader and wrap check a batch when they take it in; the transforms an Augment
    applies to it check nothing again, and called on its own an Augment checks once."""
    calls = []
    check = transforms._check_batch
    monkeypatch.setattr(transforms, "_check_batch", lambda *a: calls.append(a[1]) or check(*a))
    aug = Augment(crop=2, flip=0.5, cutout=2, jitter=0.2, fill="reflect")
    x = batch(n=32, h=8, w=8)
    ds = latecast.from_arrays(x.numpy(), np.arange(32) % 4, classes=list("abcd"))
    assert len(list(latecast.Loader(ds, 8, device="cpu", transfer="uint8", augment=aug))) == 4
    assert len(list(latecast.wrap([x[:8], x[8:]], device="cpu", augment=aug))) == 2
    assert calls == []
    aug(x, gen(0))
    assert calls == ["Augment"]
    with pytest.raises(ConfigError, match="needs padding < 2"):  # depends on the size: per batch
        Augment(crop=2, fill="reflect")(batch(h=2, w=5))


def test_generator_on_another_device_rejected():
    meta = torch.zeros(2, 4, 4, 1, dtype=torch.uint8, device="meta")
    with pytest.raises(ConfigError, match="generator is on cpu"):
        Augment(flip=0.5)(meta, gen(0))


def test_parse_augment():
    assert Augment.parse("") is None and Augment.parse(" None ") is None
    assert Augment.parse("crop,flip,cutout") == Augment(crop=4, flip=0.5, cutout=8)
    assert Augment.parse("crop=2, cutout=6,fill=reflect") == Augment(
        crop=2, cutout=6, fill="reflect"
    )
    assert Augment.parse("flip=0.25") == Augment(flip=0.25)
    for aug in (Augment(crop=3, flip=0.1, cutout=2, fill="reflect"), Augment(flip=1.0), Augment()):
        assert Augment.parse(str(aug)) == aug
    with pytest.raises(ConfigError, match=r"unknown augmentation 'rotate'.*valid: crop"):
        Augment.parse("crop,rotate")
    with pytest.raises(ConfigError, match="not a valid int"):
        Augment.parse("crop=x")
    with pytest.raises(ConfigError, match="twice"):
        Augment.parse("flip,flip")


def test_applying_halves_take_explicit_parameters():
    x = torch.arange(12, dtype=torch.uint8).view(1, 3, 4, 1)  # rows 0-3, 4-7, 8-11
    assert translate(x, torch.tensor([[1, -1]]))[0, :, :, 0].tolist() == [
        [0, 4, 5, 6],
        [0, 8, 9, 10],
        [0, 0, 0, 0],
    ]
    assert translate(x, torch.tensor([[0, 2]]), fill="reflect")[0, 0, :, 0].tolist() == [2, 3, 2, 1]
    two = torch.cat([x, x])
    assert torch.equal(flip(two, torch.tensor([True, False])), torch.cat([x.flip(2), x]))
    erased = erase(x | 1, torch.tensor([[1, 1]]), 2)[0, :, :, 0]
    assert (erased == 0).nonzero().tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    shape=st.tuples(st.integers(0, 9), st.integers(1, 9), st.integers(1, 9), st.integers(1, 4)),
    padding=st.integers(0, 12),
    fill=st.sampled_from(["zero", "reflect"]),
    crop=st.booleans(),
    flips=st.sampled_from(["off", "none", "all", "some"]),
    size=st.integers(1, 12),
    dtype=st.sampled_from([torch.uint8, torch.int64]),
    seed=st.integers(0, 2**31),
)
def test_cpu_copies_equal_the_batched_gathers(shape, padding, fill, crop, flips, size, dtype, seed):
    """The CPU's row copies equal the GPU's batched ``translate``, ``flip`` and ``erase``
    value for value: both fills, padding past the image, any flips, any dtype (masks)."""
    n, h, w, _ = shape
    padding = min(padding, min(h, w) - 1) if fill == "reflect" else padding
    g = gen(seed)
    x = torch.randint(0, 256, shape, generator=g).to(dtype)
    shifts = crop_params(x, padding, g) if crop else None
    mask = {"off": None, "none": torch.zeros(n, dtype=torch.bool), "all": torch.ones(n) > 0}
    mask = mask.get(flips, flip_params(x, 0.5, g))
    want = x if shifts is None else translate(x, shifts, fill=fill)
    want = want if mask is None else flip(want, mask)
    aug = Augment(crop=padding, fill=fill, cutout=size)
    assert torch.equal(Draw(aug, None, shifts, mask).shift_and_flip(x), want)
    if dtype == torch.uint8:
        got = Draw(aug, cutout=cutout_params(x, gen(seed))).colour(x)
        assert torch.equal(got, erase(x, cutout_params(x, gen(seed)), size))


class Calls(TorchFunctionMode):
    """Records each torch function called inside it, with its tensor arguments' shapes."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
        self.seen.append((getattr(func, "__name__", ""), shapes))
        return func(*args, **(kwargs or {}))


def test_cpu_augment_reads_no_per_pixel_index_or_mask():
    """The CPU form is what runs there: no gather, ``where`` or ``masked_fill`` of the batch."""
    x = batch(n=16)
    with Calls() as calls:
        Augment(crop=4, flip=0.5, cutout=4)(x, gen(0))
        Augment(crop=4, flip=0.5, fill="reflect")(x, gen(0))
    batched = {"__getitem__", "where", "masked_fill", "masked_fill_"}
    assert [f for f, shapes in calls.seen if f in batched and x.shape in shapes] == []
