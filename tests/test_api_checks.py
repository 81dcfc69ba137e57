"""The Python API's edges (issue 18, points 5, 7 and 8): declared dtypes checked, never
wrapped around; every entry point checks its arguments when called, with one LatecastError
naming the argument and its value; what it accepts does not fail later; nested tensors,
a failing source."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import latecast
from latecast.errors import BatchError, ConfigError, FormatError
from latecast.lightning import PrepareOnDevice
from latecast.loader import Loader
from latecast.transforms import Augment, Mix
from latecast.wrapper import Fields


def first(batch, **kwargs):
    return next(iter(latecast.wrap([batch], device="cpu", **kwargs)))


# -- point 5: declared dtypes ---------------------------------------------------------------


def test_values_that_do_not_fit_a_declared_dtype_are_refused_never_wrapped_around():
    both = {"x": (torch.int16, torch.uint8)}
    with pytest.raises(BatchError, match=r"'x': values -5..300 .* declared torch.uint8 \(0..255\)"):
        first({"x": torch.tensor([-5, 300])}, fields=both)
    out = first({"x": torch.tensor([5, 200])}, fields=both)["x"]
    assert out.dtype == torch.uint8 and out.tolist() == [5, 200]
    with pytest.raises(BatchError, match="values 0..70000 do not fit the declared torch.float16"):
        first({"x": torch.tensor([0, 70000])}, fields={"x": (torch.int32, torch.float16)})
    with pytest.raises(BatchError, match=r"values 0..18446744073709551615 do not fit torch.int64"):
        first({"x": np.array([0, 2**64 - 1], np.uint64)})
    # on a batch Lightning already moved (the same check, the values read on the device)
    with pytest.raises(BatchError, match="values -5..300 do not fit the declared torch.uint8"):
        Fields(fields=both).plan_batch([("x", torch.tensor([-5, 300]))], host=False)


def test_a_one_byte_declared_dtype_is_honoured_or_refused():
    small = torch.tensor([0, 100, 127], dtype=torch.uint8)
    wrapped = latecast.wrap([{"x": small}], device="cpu", fields={"x": torch.int8})
    (out,) = list(wrapped)
    assert out["x"].tolist() == [0, 100, 127] and wrapped.stats.label_bytes == 3
    with pytest.raises(BatchError, match="values 0..200 do not fit the declared torch.int8"):
        first({"x": torch.tensor([0, 200], dtype=torch.uint8)}, fields={"x": torch.int8})


# -- point 7: arguments checked when called -------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"mean": 0.5, "std": 0.5}, "mean 0.5 and std 0.5: give both, as long sequences"),
        ({"mean": (), "std": ()}, r"mean \(\) and std \(\)"),
        ({"mean": "abc", "std": "abc"}, "mean 'abc' and std 'abc'"),
        ({"mean": (0.5, float("nan")), "std": (1, 1)}, "finite"),
        ({"fields": ["image"]}, r"fields must be a dict .* got \['image'\]"),
        ({"fields": {"x": np.int16}}, r"fields\['x'\]"),
        ({"fields": {"x": (torch.int16, torch.bool)}}, r"fields\['x'\]"),
        ({"seed": 0.5}, r"seed must be an integer in 0..2\*\*63-1, got 0.5"),
        ({"seed": -1}, "seed must be an integer"),
        ({"augment": 5}, r"augment must be f\(images, generator\), got 5"),
        ({"augment": Augment(altflip=True)}, "augment must be without altflip"),
        ({"dtype": torch.int32}, "dtype must be one of torch.float32.*got torch.int32"),
        ({"channels_last": "yes"}, "channels_last must be a bool, got 'yes'"),
        ({"layout": np.array(["NHWC"])}, "layout must be one of auto, NHWC, NCHW"),
        ({"mask": "mask"}, "unknown option 'mask'; the options: mean, std, augment"),
    ],
)
def test_wrap_and_prepare_on_device_check_their_arguments_at_once(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        latecast.wrap([], **kwargs)

    class Module(PrepareOnDevice):
        pass

    with pytest.raises(ConfigError, match=match):
        Module().prepare_on_device(**kwargs)


def test_what_wrap_accepts_does_not_fail_at_the_first_batch():
    x = torch.zeros(2, 5, 6, 3, dtype=torch.uint8)
    for kwargs in [
        {"seed": np.int64(3), "augment": Augment(crop=1, flip=0.5)},
        {"mean": [0.5] * 3, "std": np.array([0.2, 0.3, 0.4]), "dtype": torch.float16},
        {"channels_last": np.bool_(True), "layout": "NHWC"},
    ]:
        assert first(x, **kwargs).shape == (2, 3, 5, 6)
    with pytest.raises(ConfigError, match="batches must be an iterable of batches, got 5"):
        latecast.wrap(5)


def test_numpy_arrays_torch_cannot_share_are_copied_and_cross():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, 5, 6, 3), dtype=np.uint8)
    flipped = images[:, :, ::-1]  # np.fliplr's kind of view: negative strides
    big = np.arange(3, dtype=">i4") * 1000  # big-endian
    out = first((flipped, big))
    want = torch.from_numpy(flipped.copy()).permute(0, 3, 1, 2) / 255
    assert torch.allclose(out[0], want, atol=1e-7)
    assert out[1].dtype == torch.int64 and out[1].tolist() == [0, 1000, 2000]


@pytest.fixture(scope="module")
def tiny():
    rng = np.random.default_rng(0)
    return latecast.from_arrays(rng.integers(0, 256, (8, 4, 4, 3), np.uint8), np.arange(8) % 5)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"order": "block:x"}, "order must be random, block"),
        ({"order": 5}, "order must be random"),
        ({"dtype": torch.int32}, "dtype must be torch.float32.*got torch.int32"),
        ({"shuffle": "yes"}, "shuffle must be True or False, got 'yes'"),
        ({"static": 1}, "static must be True or False, got 1"),
        ({"augment": 5}, r"augment must be f\(images, generator\), got 5"),
        ({"mix": Mix(classes=3, mixup=0.2)}, "mix must be a Mix of the dataset's 5 classes"),
        ({"mix": "mixup"}, "mix must be f"),
        ({"transfer": 5}, "transfer must be a transfer name"),
        ({"rank": "0"}, "rank must be an integer or None, got '0'"),
        ({"world_size": 2.0}, "world_size must be an integer or None, got 2.0"),
    ],
)
def test_loader_checks_its_arguments_at_once(tiny, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Loader(tiny, 4, device="cpu", **kwargs)
    with pytest.raises(ConfigError, match="dataset must be a latecast Dataset"):
        Loader(None, 4)


def test_mix_widens_narrow_labels_and_names_labels_outside_its_classes():
    images, g = torch.rand(4, 3, 5, 5), torch.Generator
    want = Mix(classes=3, mixup=0.4)(images, torch.tensor([0, 1, 2, 1]), g().manual_seed(1))
    got = Mix(classes=3, mixup=0.4)(
        images, torch.tensor([0, 1, 2, 1], dtype=torch.int8), g().manual_seed(1)
    )
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ConfigError, match=r"Mix: labels 0..3 outside 0..2"):
        Mix(classes=3, cutmix=1.0)(images, torch.tensor([0, 1, 2, 3]), g())
    with pytest.raises(ConfigError, match="Mix expects integer labels"):
        Mix(classes=3, mixup=1.0)(images, torch.rand(4), g())
    with pytest.raises(ConfigError, match=r"Mix: \(3,\) labels for 4 images"):
        Mix(classes=3, mixup=1.0)(images, torch.tensor([0, 1, 2]), g())


def test_from_arrays_refuses_strings_for_numbers_and_names():
    images, labels = np.zeros((2, 3, 3, 2), np.uint8), np.array([0, 1])
    for kwargs in [
        {"mean": "05", "std": "11"},  # was (0.0, 5.0) and (1.0, 1.0)
        {"mean": (0.5, 0.5), "std": (True, 1)},
        {"classes": "ab"},  # was two classes "a" and "b"
        {"name": None},
        {"split": 5},
    ]:
        with pytest.raises(FormatError, match="name and split must be strings"):
            latecast.from_arrays(images, labels, **kwargs)
    ds = latecast.from_arrays(images, labels, mean=[0.5, 0.5], std=np.array([0.2, 0.3]))
    assert ds.mean == (0.5, 0.5) and ds.std == (0.2, 0.3)


# -- point 8: nested tensors, a source that fails --------------------------------------------


def test_a_tensor_nested_in_a_field_is_refused_rather_than_left_on_the_host():
    with pytest.raises(BatchError, match=r"field 'a' is a dict holding tensors.*'a.x': tensor"):
        first({"a": {"b": torch.zeros(2)}, "y": torch.arange(2)})
    with pytest.raises(BatchError, match="field 1 is a list holding tensors"):
        first((torch.arange(2), [torch.zeros(2), torch.ones(2)]))
    meta = {"names": ["a", "b"], "ids": (1, 2)}  # nothing to move: it passes through as it is
    assert first({"meta": meta, "y": torch.arange(2)})["meta"] is meta


def test_a_source_that_fails_at_batch_k_hands_out_batch_k_minus_1_first():
    def source():
        for k in range(3):
            yield torch.full((2,), k)
        raise OSError("the disk went away at batch 3")

    wrapped, got = latecast.wrap(source(), device="cpu"), []
    with pytest.raises(OSError, match="batch 3"):
        for batch in wrapped:
            got.append(batch.tolist())
    assert got == [[0, 0], [1, 1], [2, 2]] and wrapped.position == 3
    images = torch.zeros(2, 5, 6, 3, dtype=torch.uint8)
    bad = [images, images, images.float()]  # batch 2 fails its own check
    wrapped, got = latecast.wrap(bad, device="cpu", fields={0: "image"}), []
    with pytest.raises(BatchError, match="field 0 is declared an image"):
        got.extend(wrapped)
    assert len(got) == 2
