"""The Python API's edges (issue 18): declared dtypes checked, never wrapped around; every
argument checked when called (one LatecastError naming it); nested tensors, a failing source."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import latecast
from latecast import PrepareOnDevice
from latecast.errors import BatchError, ConfigError, FormatError, LatecastError
from latecast.integrations.plan import Options, plan
from latecast.loader import Loader
from latecast.transforms import Augment, Erasing, Mix


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
        plan(Options(fields=both), [("x", torch.tensor([-5, 300]))])


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
        ({"seed": 0.5}, "seed must be an integer >= 0 and < 9223372036854775808, got 0.5"),
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


# -- issue 27: more arguments checked when called -------------------------------------------


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: latecast.jpeg(224.0), r"jpeg\(size=...\) must be an integer N or \(H, W\)"),
        (lambda: latecast.jpeg(224.5), r"got 224.5"),
        (lambda: latecast.jpeg((float("inf"), 3)), r"got \(inf, 3\)"),
        (lambda: latecast.jpeg((float("nan"), 3)), r"got \(nan, 3\)"),
        (lambda: latecast.jpeg(True), "got True"),  # was (1, 1)
        (lambda: latecast.jpeg((24, 32, 3)), r"got \(24, 32, 3\)"),
        (lambda: latecast.jpeg("ab"), "got 'ab'"),
        (lambda: latecast.jpeg(70000), "in 1..65535"),
        (lambda: latecast.jpeg(channels=3.0), r"jpeg\(channels=...\) must be 1, 3 or None"),
        (lambda: latecast.jpeg(channels=True), "got True"),
        (lambda: Erasing(scale=0.2), r"Erasing scale must be \(a, b\) with 0 < a <= b <= 1"),
        (lambda: Erasing(scale=(0.1,)), r"got \(0.1,\)"),
        (lambda: Erasing(scale=(0.1, 0.2, 0.3)), r"got \(0.1, 0.2, 0.3\)"),
        (lambda: Erasing(scale="ab"), "got 'ab'"),
        (lambda: Erasing(scale=(0.5, 0.2)), r"got \(0.5, 0.2\)"),
        (lambda: Erasing(ratio=None), r"Erasing ratio must be \(a, b\) with 0 < a <= b, got None"),
        (lambda: Erasing(value=float("nan")), "Erasing value must be a number"),
        (lambda: Erasing(value=("a",)), "Erasing value must be"),
        (lambda: Erasing(value="Random"), "got 'Random'"),
        (lambda: Erasing(p=True), "Erasing p must be a number"),
        (  # one value per channel: the channels are known from mean/std
            lambda: latecast.wrap([], mean=(0.5,) * 3, std=(0.2,) * 3, erase=Erasing(value=(1, 2))),
            r"erase.value must be one number or 3, one per channel as mean/std, got \(1.0, 2.0\)",
        ),
    ],
)
def test_jpeg_and_erasing_check_their_arguments_when_made(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_what_jpeg_and_erasing_accept_works_and_a_wrong_value_count_is_named_at_the_batch():
    assert latecast.jpeg(np.int64(32)).size == (32, 32)
    assert latecast.jpeg(np.array([24, 32]), channels=np.int64(1)) == latecast.jpeg((24, 32), 1)
    e = Erasing(p=np.float32(1), scale=[0.1, 0.2], ratio=np.array([0.5, 2]), value=[1, 2, 3])
    assert (e.p, e.scale, e.ratio, e.value) == (1.0, (0.1, 0.2), (0.5, 2.0), (1.0, 2.0, 3.0))
    x = torch.zeros(2, 3, 8, 8)
    assert (e(x, torch.Generator()) != 0).any()
    with pytest.raises(ConfigError, match=r"Erasing value \(1.0, 2.0\): 2 values for 3 channels"):
        Erasing(p=1, value=(1, 2))(x)  # no mean/std told wrap the channels: said at the batch
    with pytest.raises(ConfigError, match="Erasing expects a float tensor"):
        e(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))
    with pytest.raises(ConfigError, match="2 values for 3 channels"):
        first(torch.zeros(2, 8, 8, 3, dtype=torch.uint8), erase=Erasing(p=1, value=(1, 2)))


@pytest.mark.parametrize("epoch", [2**64, -1, 1.5, True, "1"])
def test_set_epoch_takes_an_epoch_number_only(tiny, epoch):
    for loader in (Loader(tiny, 4, device="cpu"), latecast.wrap([], device="cpu")):
        with pytest.raises(ConfigError, match=r"epoch must be an integer in 0..2\*\*63-1"):
            loader.set_epoch(epoch)
    loader = Loader(tiny, 4, device="cpu", seed=2**63 - 1, order="block:2:3")
    loader.set_epoch(np.int64(2**63 - 1))  # the largest seed at the largest epoch still draws
    assert len(next(iter(loader))[0]) == 4 and type(loader.epoch) is int


def test_from_arrays_reads_channels_last_only_and_says_what_else_it_sees():
    labels = np.arange(4) % 2
    for shape in [(4, 4, 8, 8), (4, 3, 32, 32), (4, 1, 8, 8), (4, 2, 9, 9)]:  # RGBA NCHW too
        with pytest.raises(FormatError, match=r"look like \(N, C, H, W\).*transpose\(0, 2, 3, 1"):
            latecast.from_arrays(np.zeros(shape, np.uint8), labels)
    with pytest.raises(FormatError, match=r"\(N, H, W, C\) have 1 to 4 channels, got .*8, 8\)"):
        latecast.from_arrays(np.zeros((4, 8, 8, 8), np.uint8), labels)
    rgba = np.zeros((4, 8, 8, 4), np.uint8)
    with pytest.raises(
        FormatError, match=r"need 4 finite.*RGBA\? drop the alpha, images\[\.\.\., :3\]"
    ):
        latecast.from_arrays(rgba, labels, mean=(0.5,) * 3, std=(0.2,) * 3)
    assert latecast.from_arrays(rgba, labels).image_shape == (8, 8, 4)  # 4 channels, as asked
    with pytest.raises(
        ConfigError, match=r"color jitter takes 1 or 3 channels, got \(4, 8, 8, 4\)"
    ):
        Augment(jitter=0.4)(torch.from_numpy(rgba), torch.Generator())  # as torchvision's


@pytest.mark.parametrize("bad", [None, True, 1.5, "x", [1, 2], np.int64(3), torch.zeros(2)])
def test_the_other_entry_points_take_no_raw_python_error_from_their_arguments(tiny, bad):
    """normalize, load_dataset, open_store and load_state_dict raised AttributeError or
    TypeError on arguments of the wrong type: one LatecastError naming the argument."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    x = torch.zeros(2, 4, 4, 3, dtype=torch.uint8)
    calls = [
        lambda: latecast.normalize(bad, (0.5,), (0.2,)),
        lambda: latecast.normalize(x, (0.5,), (0.2,), dtype=bad),
        lambda: latecast.normalize(x, (0.5,), (0.2,), out=bad),
        lambda: latecast.normalize(x, (0.5,), (0.2,), channels_last=bad),
        lambda: latecast.load_dataset(bad),
        lambda: latecast.load_dataset("mnist", split=bad),
        lambda: latecast.load_dataset("fashion-mnist", root=bad),
        lambda: latecast.open_store(bad),
        lambda: Loader(tiny, 4).load_state_dict(bad),
        lambda: latecast.wrap(StatefulDataLoader(list(range(4)))).load_state_dict(bad),
    ]
    for k, call in enumerate(calls):
        if (bad is None and k in (2, 6)) or (bad is True and k == 3):  # valid values there
            continue
        with pytest.raises(LatecastError):  # "x": no such dataset, store or split: said so
            call()
