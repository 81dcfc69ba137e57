"""The Python API under random arguments (issues 18, 27), each entry point then used on a
tiny batch: every call works or raises one ``LatecastError``. Arguments are mostly valid, so
calls get past the first check."""

from __future__ import annotations

import io

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import latecast
from latecast.errors import LatecastError
from latecast.loader import Loader
from latecast.transforms import Augment, Erasing, Mix

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck),
               derandomize=True)  # fmt: skip

ODD = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 40),
    st.sampled_from([2**63, -(2**63), 2**64, np.int64(3), np.uint8(2), np.bool_(True)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.sampled_from(["auto", "cpu", "cuda", "meta", "image", "mask", "random", "block:2:2"]),
    st.sampled_from([torch.float32, torch.int32, torch.uint8, torch.bool, torch.complex64]),
    st.lists(st.floats(-2, 2), max_size=4).map(tuple),
    st.dictionaries(st.sampled_from([0, 1, "x", "image"]), st.sampled_from(["image", "mask"])),
    st.sampled_from([(), [0.5], (0.1, 0.2, 0.3), ("a", "b"), {"a": 1}, object()]),
    st.sampled_from([np.zeros(3), torch.zeros(2, 2), np.array(["a"]), lambda *a: None]),
)  # fmt: skip


def maybe(valid: st.SearchStrategy) -> st.SearchStrategy:
    """A valid value 7 times in 8, so that most calls get past their first check."""
    return st.tuples(st.integers(0, 7), valid, ODD).map(lambda t: t[2] if t[0] == 7 else t[1])


def tensors() -> st.SearchStrategy:
    """Tiny fields: torch or numpy, any dtype, 0 to 4 dims, numpy views torch cannot share."""
    dtypes = ["uint8", "int8", "int16", "int64", "uint16", "uint64", "float32", "bool", ">i4"]
    shapes = st.sampled_from([(), (2,), (2, 3), (2, 4, 4), (2, 3, 4, 4), (2, 4, 4, 3), (0, 3)])

    def make(dtype, shape, kind, big):
        a = np.random.default_rng(0).integers(0, 300 if big else 3, shape).astype(dtype)
        if kind == "flip" and a.ndim:
            return a[..., ::-1]
        if kind == "torch" and a.dtype.isnative and a.dtype != np.uint64:
            return torch.from_numpy(a.copy())
        return a

    kinds = st.sampled_from(["torch", "numpy", "flip"])
    return st.builds(make, st.sampled_from(dtypes), shapes, kinds, st.booleans())


UINT8 = torch.arange(96, dtype=torch.uint8).view(2, 4, 4, 3)  # a valid tiny batch of images
SEGMENTATION = {"image": UINT8.permute(0, 3, 1, 2), "mask": torch.arange(32).view(2, 4, 4)}
BATCHES = st.one_of(
    st.sampled_from([UINT8, (UINT8, torch.arange(2)), SEGMENTATION]), tensors(),
    st.tuples(tensors(), tensors()),
    st.dictionaries(st.sampled_from(["image", "mask", "x", 0]), st.one_of(
        tensors(), st.text(max_size=2), st.dictionaries(st.just("y"), tensors())), max_size=3),
    ODD,
)  # fmt: skip


class Later:
    """A call made inside the test, where its LatecastError is one of the allowed outcomes."""

    def __init__(self, cls, *args, **kwargs):
        self.cls, self.args, self.kwargs = cls, args, kwargs

    def __repr__(self) -> str:
        return f"{self.cls.__name__}(*{self.args!r}, **{self.kwargs!r})"


def made(value):
    return value.cls(*value.args, **value.kwargs) if isinstance(value, Later) else value


AUGMENTS = st.builds(
    Later, st.just(Augment), crop=maybe(st.integers(0, 3)), flip=maybe(st.floats(0, 1)),
    cutout=maybe(st.integers(0, 3)), fill=maybe(st.sampled_from(["zero", "reflect"])),
    resized_crop=maybe(st.floats(0, 1)), jitter=maybe(st.floats(0, 1)),
    altflip=maybe(st.sampled_from([False, False, True])),
)  # fmt: skip


def tolerated(call) -> None:
    try:
        call()
    except LatecastError:
        pass


@FUZZ
@given(
    batches=st.lists(BATCHES, max_size=2),
    kwargs=st.fixed_dictionaries(
        {},
        optional={
            "mean": maybe(st.sampled_from([(0.5,), (0.5, 0.4, 0.3)])),
            "std": maybe(st.sampled_from([(0.2,), (0.2, 0.3, 0.4)])),
            "device": maybe(st.just("cpu")),
            "augment": maybe(AUGMENTS),
            "dtype": maybe(st.sampled_from([torch.float32, torch.bfloat16])),
            "channels_last": ODD,
            "layout": maybe(st.sampled_from(["auto", "NHWC", "NCHW"])),
            "fields": maybe(
                st.dictionaries(
                    st.sampled_from(["image", "mask", "x", 0, 1]),
                    st.sampled_from(
                        ["image", "mask", torch.uint16, (torch.int16, torch.uint8), torch.int8]
                    ),
                    max_size=2,
                )
            ),
            "seed": maybe(st.integers(0, 5)),
            "bad_option": st.just(1),
        },
    ),
)
def test_wrap_under_random_arguments_and_batches(batches, kwargs):
    def run():
        options = {k: made(v) for k, v in kwargs.items()}
        return [len(str(b)) for b in latecast.wrap(batches, **options)]

    tolerated(run)


@FUZZ
@given(
    kwargs=st.fixed_dictionaries(
        {"batch_size": maybe(st.integers(1, 5))},
        optional={
            "device": maybe(st.just("cpu")),
            "transfer": maybe(st.sampled_from(["auto", "uint8", "float32", "resident", "x"])),
            "shuffle": ODD,
            "seed": maybe(st.integers(0, 3)),
            "drop_last": ODD,
            "dtype": maybe(st.just(torch.float16)),
            "rank": maybe(st.integers(0, 1)),
            "world_size": maybe(st.integers(1, 2)),
            "augment": maybe(AUGMENTS),
            "pad": ODD,
            "order": maybe(st.sampled_from(["random", "block", "block:2:1", "block:0:1"])),
            "mix": maybe(
                st.builds(Later, st.just(Mix), maybe(st.integers(1, 4)), maybe(st.floats(0, 2)))
            ),
            "static": ODD,
        },
    ),
    dataset=maybe(st.just("tiny")),
)
def test_loader_under_random_arguments(kwargs, dataset):
    rng = np.random.default_rng(0)
    tiny = latecast.from_arrays(rng.integers(0, 256, (7, 4, 4, 3), np.uint8), np.arange(7) % 3)
    data = tiny if dataset == "tiny" else dataset
    tolerated(lambda: next(iter(Loader(data, **{k: made(v) for k, v in kwargs.items()}))))


@FUZZ
@given(augment=AUGMENTS, images=maybe(st.just(UINT8)) | tensors(), generator=maybe(st.just("cpu")))
def test_augment_under_random_arguments(augment, images, generator):
    cpu = generator == "cpu" and isinstance(generator, str)
    g = torch.Generator().manual_seed(0) if cpu else generator
    tolerated(lambda: made(augment)(images, g))


@FUZZ
@given(
    classes=maybe(st.integers(1, 4)),
    mixup=maybe(st.floats(0, 2)),
    cutmix=maybe(st.floats(0, 2)),
    images=maybe(st.just("float")),
    labels=maybe(
        st.sampled_from([torch.tensor([0, 1]), torch.tensor([1, 2], dtype=torch.int8)]) | tensors()
    ),
)
def test_mix_under_random_arguments(classes, mixup, cutmix, images, labels):
    x = torch.zeros(2, 3, 4, 4) if isinstance(images, str) else images
    tolerated(lambda: Mix(classes, mixup, cutmix)(x, labels, torch.Generator()))


@FUZZ
@given(
    images=maybe(st.sampled_from([np.zeros((3, 4, 4, 3), np.uint8), torch.ones(3, 2, 2)]))
    | tensors(),
    labels=maybe(st.sampled_from([np.arange(3), torch.tensor([0, 1, 300])])) | tensors(),
    kwargs=st.fixed_dictionaries(
        {},
        optional={
            "name": maybe(st.just("x")),
            "split": maybe(st.just("test")),
            "classes": maybe(st.sampled_from([("a", "b", "c"), ["a"] * 301])),
            "mean": maybe(st.sampled_from([(0.5,), (0.5, 0.5, 0.5)])),
            "std": maybe(st.sampled_from([(0.2,), (0.2, 0.3, 0.2)])),
        },
    ),
)
def test_from_arrays_under_random_arguments(images, labels, kwargs):
    tolerated(lambda: latecast.from_arrays(images, labels, **kwargs))


def jpeg_files(h: int, w: int, n: int = 2, grey: bool = False) -> list[bytes]:
    from PIL import Image

    out = []
    for i in range(n):
        buf = io.BytesIO()
        pixels = np.full((h, w) if grey else (h, w, 3), 40 * i, np.uint8)
        Image.fromarray(pixels).save(buf, "JPEG")
        out.append(buf.getvalue())
    return out


PAIRS = st.sampled_from(  # JPEG files and masks of their size: the path that must work
    [
        (jpeg_files(8, 8), torch.arange(128).view(2, 8, 8) % 5),
        (jpeg_files(6, 10), torch.zeros(2, 6, 10, dtype=torch.uint8)),
        (jpeg_files(8, 8, grey=True), torch.zeros(2, 1, 8, 8)),
    ]
)
ODD_BATCHES = st.one_of(ODD, tensors(), st.just(jpeg_files(8, 8, n=3)))
PAIRED = st.tuples(PAIRS, st.integers(0, 7), st.integers(0, 7), ODD_BATCHES).map(
    lambda t: (t[3] if t[1] == 7 else t[0][0], t[3] if t[2] == 7 else t[0][1])
)  # each of the two something else once in 8
JPEGS = st.builds(
    Later,
    st.just(latecast.jpeg),
    size=maybe(st.sampled_from([None, 4, (4, 6), np.int64(5), (8, 8)])),
    channels=maybe(st.sampled_from([None, 1, 3])),
)
ERASINGS = st.builds(
    Later,
    st.just(Erasing),
    p=maybe(st.floats(0, 1)),
    scale=maybe(st.sampled_from([(0.02, 0.33), [0.1, 0.5], (0.5, 0.5)])),
    ratio=maybe(st.sampled_from([(0.3, 3.3), (1, 1), np.array([0.5, 2.0])])),
    value=maybe(st.sampled_from([0, 1.5, (0.1, 0.2, 0.3), [0.5], "random", (1.0, 2.0)])),
)


@FUZZ
@given(
    paired=PAIRED,
    spec=maybe(JPEGS),
    erase=maybe(ERASINGS | st.none()),
    augment=maybe(st.sampled_from([None, Augment(flip=0.5), Augment(resized_crop=0.3, crop=1)])),
    mean=maybe(st.sampled_from([None, (0.5,), (0.5, 0.4, 0.3)])),
    declared=st.booleans(),
    mover=st.booleans(),
)
def test_jpeg_fields_masks_erasing_and_the_mover_under_random_arguments(
    paired, spec, erase, augment, mean, declared, mover
):
    """JPEG files (or anything) with a mask (or anything), a random ``latecast.jpeg``,
    ``Erasing`` and ``Augment``, through ``wrap`` or a ``Mover``."""

    def run():
        fields = {"mask": "mask", **({"jpg": made(spec)} if declared else {})}
        options = dict(fields=fields, erase=made(erase), augment=made(augment), device="cpu")
        options.update({} if mean is None else {"mean": mean, "std": mean})
        batch = {"jpg": paired[0], "mask": paired[1], "y": torch.arange(2)}
        if mover:
            return latecast.Mover(**options)(batch)
        return list(latecast.wrap([batch], **options))

    tolerated(run)
