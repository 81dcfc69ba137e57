"""``latecast.wrap`` inside programs nobody here wrote (issue 20), in their shapes: Lightning's
sampler injection, accelerate's end-of-data signals, timm's loader attributes, the ImageNet
script's second loader; set-ups that ran silently wrong. Under launchers: test_examples.py."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import lightning_trainer
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import latecast
from latecast import PrepareOnDevice

ROOT = Path(__file__).resolve().parents[2]
N, BATCH = 64, 8  # per rank under DDP: 32 samples, 4 batches an epoch
MEAN, STD = (0.4, 0.5, 0.6), (0.2, 0.3, 0.25)


def ids_data() -> tuple[torch.Tensor, TensorDataset]:
    """uint8 NCHW images (as ``PILToTensor()`` collates them); sample ``i`` has label ``i``."""
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (N, 3, 5, 6), dtype=np.uint8))
    return images, TensorDataset(images, torch.arange(N))


def reference(nchw: torch.Tensor) -> torch.Tensor:
    return latecast.normalize(nchw.permute(0, 2, 3, 1), MEAN, STD)  # ToTensor + Normalize


# -- a DataLoader to frameworks, every attribute the wrapped loader's --------------------


class Custom(DataLoader):
    """A program's own loader class, with an argument of its own (as timm's and many have)."""

    def __init__(self, dataset, tag: str, **kwargs):
        super().__init__(dataset, **kwargs)
        self.tag = tag


def test_wrap_of_a_dataloader_is_one_of_its_class_sharing_every_attribute():
    images, data = ids_data()
    dl = Custom(data, "train", batch_size=BATCH, shuffle=True, num_workers=0)
    before = set(vars(dl))
    w = latecast.wrap(dl, mean=MEAN, std=STD, device="cpu")
    assert isinstance(w, Custom) and isinstance(w, DataLoader)
    assert (w.dataset, w.tag, w.num_workers, w.collate_fn) == (data, "train", 0, dl.collate_fn)
    w.log_every = 10  # a program's own attribute on its loader
    dl.custom = 7
    assert dl.log_every == 10 and w.custom == 7
    with pytest.raises(ValueError, match="batch_size attribute should not be set"):
        w.batch_size = 4  # as on the DataLoader itself
    x, y = next(iter(w))
    assert x.dtype == torch.float32 and torch.equal(x, reference(images[y]))
    assert set(vars(dl)) - before == {"log_every", "custom"}  # latecast's own stay its own
    assert w.epoch == 0 and not hasattr(dl, "epoch")


def test_a_loader_remade_from_its_class_is_wrapped_the_same_way():
    """What Lightning does to inject its DistributedSampler: ``type(w)(**arguments)``."""
    images, data = ids_data()
    w = latecast.wrap(Custom(data, "t", batch_size=BATCH), mean=MEAN, std=STD, device="cpu")
    shares = []
    for rank in range(2):
        sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=0)
        again = type(w)(w.dataset, w.tag, batch_size=BATCH, sampler=sampler)
        assert isinstance(again, Custom) and again.sampler is sampler and again.tag == "t"
        batches = list(again)
        for x, y in batches:
            assert torch.equal(x, reference(images[y]))
        shares.append(torch.cat([y for _, y in batches]).tolist())
        assert again.stats.batches == len(batches) == 4
    assert sorted(shares[0] + shares[1]) == list(range(N))


def test_a_loader_that_is_no_dataloader_gets_its_attributes_set_too():
    """timm's PrefetchLoader is no DataLoader; ``mixup_enabled`` is a property of it that
    reaches its collate function (regression: AttributeError through ``wrap``)."""

    class Mixup:
        mixup_enabled = True

    class PrefetchShaped:
        def __init__(self, loader):
            self.loader = loader

        def __iter__(self):
            return iter(self.loader)

        @property
        def mixup_enabled(self):
            return self.loader.collate_fn.mixup_enabled

        @mixup_enabled.setter
        def mixup_enabled(self, x):
            self.loader.collate_fn.mixup_enabled = x

    mix = Mixup()
    source = PrefetchShaped(DataLoader(ids_data()[1], batch_size=BATCH))
    source.loader.collate_fn, w = mix, latecast.wrap(source, device="cpu")
    w.mixup_enabled = False
    assert mix.mixup_enabled is False and w.mixup_enabled is False and w.loader is source.loader
    with pytest.raises(AttributeError):
        w.no_such_thing  # noqa: B018


# -- loaders a program re-makes ---------------------------------------------------------


def test_the_imagenet_scripts_second_val_loader_from_loader_dataset():
    """The samples a drop_last sampler leaves out, validated by a second loader over
    ``Subset(val_loader.dataset, ...)`` (regression: uint8, "expected scalar type Byte"),
    re-made by ``wrap`` with its ``mean``/``std`` or ``type(val_loader)``: all normalized."""
    from torch.utils.data import Subset

    images, _ = ids_data()
    val = TensorDataset(images[:13], torch.arange(13))  # 13 samples, 2 ranks: one left out
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(val, num_replicas=2, rank=rank, shuffle=False, drop_last=True)
        dl = DataLoader(val, batch_size=4, sampler=sampler)
        val_loader = latecast.wrap(dl, mean=MEAN, std=STD, device="cpu")
        assert (val_loader.mean, val_loader.std) == (MEAN, STD) and val_loader.options.mean == MEAN
        rest = Subset(val_loader.dataset, range(len(val_loader.sampler) * 2, len(val)))
        aux = DataLoader(rest, batch_size=4, shuffle=False)
        for second in (
            latecast.wrap(aux, mean=val_loader.mean, std=val_loader.std, device="cpu"),
            type(val_loader)(rest, batch_size=4, shuffle=False),
        ):
            for x, y in second:
                assert x.dtype == torch.float32 and torch.equal(x, reference(images[y]))
        ids = [y for loader in (val_loader, second) for _, y in loader]
        seen.append(torch.cat(ids).tolist())
    assert sorted(set(seen[0]) | set(seen[1])) == list(range(13)) and 12 in seen[0] + seen[1]
    assert len(set(seen[0]) & set(seen[1])) == 1  # the rest, validated by every rank


# -- batches built per call, and the random draws of the source ---------------------------


def example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nanogpt_get_batch_through_the_mover_same_tokens_same_draws_two_bytes(tmp_path):
    """The example's two-line change to nanoGPT's get_batch: the same int64 tokens on the
    device, the same global-RNG draws (train and val interleaved), 2 bytes a token."""
    ex = example("nanogpt_tokens")
    ex.write_tokens(tmp_path)
    splits = ["train", "train", "val", "train"]
    torch.manual_seed(0)
    usual = [ex.usual_batch(tmp_path, split, torch.device("cpu")) for split in splits]
    usual_rng = torch.get_rng_state()
    torch.manual_seed(0)
    moved = [ex.get_batch(tmp_path, split) for split in splits]
    assert torch.equal(torch.get_rng_state(), usual_rng)  # no draw moved or added
    for (x, y), (ux, uy) in zip(moved, usual):
        assert x.dtype == y.dtype == torch.int64 and torch.equal(x, ux) and torch.equal(y, uy)
    tokens = len(splits) * 2 * ex.BATCH * ex.BLOCK
    s = ex.mover.stats
    assert (s.label_bytes, s.h2d_bytes, s.usual_bytes) == (2 * tokens, 2 * tokens, 8 * tokens)
    assert s.copies == s.batches == ex.mover.position == len(splits)


def test_wrap_reads_one_batch_ahead_of_its_consumer_and_the_mover_none():
    """As the README says: a source drawing from the global RNG draws before step k's own
    draws through wrap (batch k + 1 taken first); through the Mover, when called."""
    calls = []

    def batches():
        for k in range(3):
            calls.append(k)
            yield torch.randint(0, 9, (4,))

    w = iter(latecast.wrap(batches(), device="cpu"))
    next(w)
    assert calls == [0, 1]
    mover, calls[:] = latecast.Mover(device="cpu"), []
    source = batches()
    mover(next(source))
    assert calls == [0]


def test_the_global_rng_draws_a_dataloader_makes_per_pass_can_be_made_before_a_loader():
    """A DataLoader draws one int64 a pass (two shuffled), the Loader none: drawn by hand
    before each pass (README), dropout stays where it was."""
    data = TensorDataset(torch.arange(N))
    for shuffle, draws in ((False, 1), (True, 2)):
        torch.manual_seed(0)
        list(DataLoader(data, batch_size=BATCH, shuffle=shuffle))
        after_dataloader = torch.get_rng_state()
        torch.manual_seed(0)
        for _ in range(draws):
            torch.empty((), dtype=torch.int64).random_()  # what the DataLoader drew
        images, labels = ids_data()[0].permute(0, 2, 3, 1).numpy(), np.arange(N)
        list(latecast.Loader(latecast.from_arrays(images, labels), BATCH, device="cpu"))
        assert torch.equal(torch.get_rng_state(), after_dataloader), shuffle


# -- no silent wrong set-up ------------------------------------------------------------


# timm's IMAGENET_DEFAULT_MEAN * 255 style constants made every output about -0.42
IN_0_255 = dict(mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375))
CPU = dict(device="cpu")


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda dl: latecast.wrap(latecast.wrap(dl, **CPU)), "wrapped already"),
        (lambda dl: latecast.wrap(dl, **IN_0_255, **CPU), "divide them by 255"),
        (lambda dl: latecast.PrepareOnDevice().prepare_on_device(**IN_0_255), "divide them by 255"),
        (lambda dl: latecast.wrap(dl, **CPU, mix=5), r"mix must be f\(images, labels, g\), got 5"),
        (lambda dl: setattr(latecast.wrap(dl, **CPU), "mixup_enabled", True), "nothing mixes here"),
    ],
    ids=["wrapped-twice", "wrap-mean-std-0-255", "hook-mean-std-0-255", "mix-no-f", "no-mix-on"],
)
def test_a_wrong_set_up_is_one_error(make, match):
    with pytest.raises(latecast.LatecastError, match=match):
        make(DataLoader(ids_data()[1]))


def test_float_images_from_to_tensor_warn_once_other_floats_and_masks_do_not(recwarn):
    images, _ = ids_data()
    floats = TensorDataset(images.float() / 255, torch.arange(N))  # ToTensor() kept
    w = latecast.wrap(DataLoader(floats, batch_size=BATCH), device="cpu")
    with pytest.warns(UserWarning, match=r"field 0 is torch.float32 \(8, 3, 5, 6\) in \[0, 1\]"):
        list(w)
    list(w)  # once a wrap, not per batch or per pass
    features = TensorDataset(torch.randn(N, 3, 5, 6), torch.arange(N))  # not in [0, 1]
    masks = TensorDataset(torch.randint(0, 21, (N, 1, 5, 6)))  # class ids: no image
    for other in (features, masks):
        list(latecast.wrap(DataLoader(other, batch_size=BATCH), device="cpu"))
    assert not [m for m in recwarn if "latecast.wrap" in str(m.message)]
    s = w.stats  # two passes: the float32 pixels crossed as they are, labels in one byte
    assert (s.other_bytes, s.label_bytes, s.usual_bytes) == (2 * N * 360, 2 * N, 2 * N * 368)


def hf_images():
    """A Hugging Face ``datasets`` table of uint8 images, formatted for torch: int64 arrive."""
    datasets = pytest.importorskip("datasets")
    images = ids_data()[0].permute(0, 2, 3, 1).numpy()  # (N, 5, 6, 3) uint8, as PIL gives
    return images, datasets.Dataset.from_dict({"image": images, "label": np.arange(N)})


def test_int64_images_from_hf_datasets_get_advice_that_fits_and_cross_as_uint8():
    images, table = hf_images()
    dl = DataLoader(table.with_format("torch"), batch_size=BATCH)
    assert next(iter(dl))["image"].dtype == torch.int64
    with pytest.raises(latecast.LatecastError, match="fields={'image': 'image'}"):
        next(iter(latecast.wrap(dl, mean=MEAN, std=STD, device="cpu")))
    w = latecast.wrap(dl, mean=MEAN, std=STD, device="cpu", fields={"image": "image"})
    for batch in w:
        want = latecast.normalize(torch.from_numpy(images[batch["label"].numpy()]), MEAN, STD)
        assert torch.equal(batch["image"], want) and batch["label"].dtype == torch.int64
    s = w.stats
    assert (s.image_bytes, s.label_bytes) == (N * 90, N)  # uint8 pixels, one-byte labels
    assert s.usual_bytes == N * 90 * 8 + N * 8  # what moving the int64 batches would cost
    too_big = TensorDataset(torch.full((4, 5, 6, 3), 256), torch.arange(4))
    with pytest.raises(latecast.LatecastError, match="256..256 do not fit uint8"):
        next(iter(latecast.wrap(DataLoader(too_big, 4), device="cpu", fields={0: "image"})))


def test_set_epoch_reaches_the_sampler_and_the_dataset():
    """A shuffled HF iterable dataset draws its order from its own epoch (regression: the
    same order every epoch through wrap)."""
    _, table = hf_images()

    def order(epoch: int, through_wrap: bool) -> list[int]:
        ds = table.to_iterable_dataset(num_shards=4).shuffle(seed=0, buffer_size=16)
        ds = ds.with_format("torch")
        dl = DataLoader(ds, batch_size=BATCH)
        w = latecast.wrap(dl, mean=MEAN, std=STD, device="cpu", fields={"image": "image"})
        (w if through_wrap else ds).set_epoch(epoch)
        return torch.cat([b["label"] for b in (w if through_wrap else dl)]).tolist()

    assert order(1, True) == order(1, False) != order(0, True) == order(0, False)

    class Epochs(TensorDataset):
        epoch = None

        def set_epoch(self, epoch):
            self.epoch = epoch

    data = Epochs(torch.arange(N))
    sampler = DistributedSampler(data, num_replicas=2, rank=0)
    latecast.wrap(DataLoader(data, sampler=sampler), device="cpu").set_epoch(3)
    assert sampler.epoch == data.epoch == 3


def test_usual_bytes_are_what_the_batches_cost_as_they_arrive():
    """timm's loader already moves uint8: through wrap only the labels shrink, and the stats
    say so (regression: counted as float32, 4x where the true saving was 0.23%)."""
    images, data = ids_data()
    w = latecast.wrap(DataLoader(data, batch_size=BATCH), mean=MEAN, std=STD, device="cpu")
    list(w)
    s = w.stats
    assert s.usual_bytes == N * 90 + N * 8 and s.h2d_bytes == N * 90 + N
    assert s.usual_bytes / s.h2d_bytes == pytest.approx(98 / 91)


# -- what a prefetching loader did: model dtype, random erasing on the device -------------


def test_random_erasing_equals_torchvisions_for_the_same_draws():
    """The batch erased with ``get_params``' boxes equals ``F.erase`` image by image, for 0,
    per-channel and per-pixel ("random") values."""
    T = pytest.importorskip("torchvision.transforms")
    from torchvision.transforms import functional as TF

    from latecast.transforms import erase_boxes

    x = reference(ids_data()[0][:16])  # normalized (16, 3, 5, 6)
    torch.manual_seed(0)
    for value in ([0.0], [0.5, -1.0, 2.0], None):  # None: torchvision's "random"
        params = [T.RandomErasing.get_params(img, (0.02, 0.4), (0.3, 3.3), value) for img in x]
        want = torch.stack(
            [TF.erase(img, i, j, h, w, v) for img, (i, j, h, w, v) in zip(x, params)]
        )
        boxes = torch.tensor([p[:4] for p in params])
        if value is None:  # each image's own normal values, where it erases
            fill = torch.zeros_like(x)
            for f, (i, j, h, w, v) in zip(fill, params):
                f[:, i : i + h, j : j + w] = v if h < x.shape[2] else 0
        else:
            fill = torch.tensor(value)[:, None, None]
        got = erase_boxes(x, boxes, fill)
        assert torch.equal(got, want), value


def test_random_erasing_through_wrap_draws_per_image_within_its_bounds():
    """timm's ``--reprob``: every image erased with probability p, boxes of the area and
    ratio asked for, the same draws again for the same (seed, epoch, batch)."""
    images = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (512, 3, 20, 24)))
    data = TensorDataset(images.to(torch.uint8))
    erase = latecast.Erasing(p=0.5, scale=(0.05, 0.2), ratio=(0.5, 2.0), value=9.0)

    def run():
        w = latecast.wrap(DataLoader(data, 128), mean=MEAN, std=STD, erase=erase, device="cpu")
        return torch.cat([b[0] for b in w])

    x = run()
    assert torch.equal(x, run())
    erased = x == 9.0  # (N, C, H, W)
    share = erased.flatten(1).any(1).float().mean().item()
    assert 0.4 < share < 0.6  # p = 0.5 of 512 images
    area = erased[:, 0].flatten(1).sum(1)
    area = area[area > 0].float() / (20 * 24)
    assert area.min() >= 0.03 and area.max() <= 0.25  # scale, up to rounding of the sides
    assert erased.all(1).eq(erased.any(1)).all()  # one box through all channels
    with pytest.raises(latecast.LatecastError, match="scale"):
        latecast.Erasing(scale=(0.5, 0.1))


def test_images_come_out_in_the_models_dtype():
    """timm's ``--model-dtype bfloat16``: its loader cast to the model's dtype; through wrap,
    ``dtype=`` does (README), or a bf16 model gets float32 and fails."""
    images, data = ids_data()
    model = torch.nn.Conv2d(3, 4, 3).to(torch.bfloat16)
    w = latecast.wrap(DataLoader(data, BATCH), mean=MEAN, std=STD, dtype=torch.bfloat16)
    x, _ = next(iter(w))
    assert x.dtype == torch.bfloat16 and model(x).dtype == torch.bfloat16
    with pytest.raises(RuntimeError):
        model(next(iter(latecast.wrap(DataLoader(data, BATCH), mean=MEAN, std=STD)))[0])


# -- mixing: in a collate_fn (torchvision's reference, timm), in wrap, and timm's switch -----


def train_steps(loader, loss_fn, features: int, mixup_fn=None) -> tuple[list, torch.Tensor]:
    """A reference script's epoch (``mixup_fn`` as timm's without its prefetcher), a linear
    model and SGD drawing nothing from the global RNG: the batches it saw, its weights."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(features, 5))
    seen, opt = [], torch.optim.SGD(model.parameters(), lr=0.1)
    for image, target in loader:
        if mixup_fn is not None:
            image, target = mixup_fn(image, target)
        loss = loss_fn(model(image), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen.append((image, target))
    return seen, model[1].weight.detach()


def assert_same_run(run, usual, atol=1e-5) -> None:
    (seen, weight), (want, want_weight) = run, usual
    assert len(seen) == len(want)
    for (x, y), (wx, wy) in zip(seen, want):
        torch.testing.assert_close(x, wx, atol=atol, rtol=0)
        torch.testing.assert_close(y, wy, atol=1e-6, rtol=0)
    torch.testing.assert_close(weight, want_weight, atol=atol, rtol=0)


def test_torchvision_references_collate_mixing_moves_to_wrap_and_trains_the_same():
    """torchvision's reference mixes floats in its ``collate_fn`` (fails on uint8); converted
    as the README says (``PILToTensor()``, the mix given to wrap as ``mix=``) an epoch trains
    as the original's: the same mixed batches within rounding, the same weights."""
    v2 = pytest.importorskip("torchvision.transforms.v2")
    from torch.utils.data import default_collate
    from torchvision.datasets import FakeData

    def mixup_cutmix():  # the reference's get_mixup_cutmix(..., use_v2=True)
        return v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=5), v2.CutMix(num_classes=5)])

    def data(*tf) -> FakeData:
        return FakeData(
            40, (3, 12, 10), num_classes=5, transform=v2.Compose([v2.PILToTensor(), *tf])
        )

    mixup = v2.MixUp(alpha=0.2, num_classes=5)
    with pytest.raises(RuntimeError, match="can't be cast"):  # the reference's collate on uint8
        next(iter(DataLoader(data(), 8, collate_fn=lambda b: mixup(*default_collate(b)))))
    loss = torch.nn.CrossEntropyLoss(label_smoothing=0.1)  # takes the mixed probabilities
    torch.manual_seed(0)
    mix = mixup_cutmix()
    tf = (v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD))
    dl = DataLoader(data(*tf), 8, shuffle=True, collate_fn=lambda b: mix(*default_collate(b)))
    usual = train_steps(dl, loss, 360)
    torch.manual_seed(0)
    mix = mixup_cutmix()
    dl = DataLoader(data(), 8, shuffle=True)  # default_collate: the mixing moved to wrap
    w = latecast.wrap(dl, mean=MEAN, std=STD, device="cpu", mix=lambda x, y, g: mix(x, y))
    assert_same_run(train_steps(w, loss, 360), usual)


def test_timms_mixing_and_its_switch_at_mixup_off_epoch_through_wrap():
    """timm's ``--mixup 0.2 --mixup-off-epoch 1``, with its prefetcher (``FastCollateMixup``,
    off by ``loader.mixup_enabled = False``: through wrap once an AttributeError or a no-op)
    and without (``Mixup`` per batch): through wrap, the same batches, mixing off at epoch 1."""
    pytest.importorskip("timm")
    from timm.data import FastCollateMixup, Mixup, create_loader
    from timm.loss import SoftTargetCrossEntropy
    from torchvision.datasets import FakeData

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # timm's IMAGENET_DEFAULT_*
    mixup_args = dict(mixup_alpha=0.2, label_smoothing=0.1, num_classes=5)

    def timm_loader(prefetcher: bool, collate_fn=None):
        data = FakeData(24, (3, 20, 18), num_classes=5)
        return create_loader(
            data,
            (3, 16, 16),
            8,
            is_training=True,
            num_workers=0,
            collate_fn=collate_fn,
            device=torch.device("cpu"),
            use_prefetcher=prefetcher,
            persistent_workers=False,
        )

    def epochs(loader, mixup_fn=None) -> tuple[list, torch.Tensor]:  # train.py's, two
        np.random.seed(0)  # timm's mixing draws from numpy's, its crops from Python's
        random.seed(0)
        runs, switch = [], []
        for epoch in range(2):
            if epoch >= 1:  # --mixup-off-epoch 1
                if mixup_fn is None and loader.mixup_enabled:
                    loader.mixup_enabled = False
                elif mixup_fn is not None:
                    mixup_fn.mixup_enabled = False
            switch.append((mixup_fn or loader).mixup_enabled)
            runs.append(train_steps(loader, SoftTargetCrossEntropy(), 3 * 16 * 16, mixup_fn))
        assert switch == [True, False]
        seen = runs[0][0] + runs[1][0]
        on_value = 1 - 0.1 + 0.1 / 5  # epoch 1: labels only smoothed, never mixed
        assert all(torch.allclose(y.max(1).values, torch.tensor(on_value)) for _, y in runs[1][0])
        return seen, runs[1][1]

    usual = epochs(timm_loader(True, FastCollateMixup(**mixup_args)))  # its PrefetchLoader
    w = latecast.wrap(timm_loader(True, FastCollateMixup(**mixup_args)).loader, mean=mean, std=std)
    assert_same_run(epochs(w), usual)

    usual = epochs(timm_loader(False), Mixup(**mixup_args))  # --no-prefetcher: float batches
    w = latecast.wrap(timm_loader(True).loader, mean=mean, std=std)  # uint8, fast_collate
    assert_same_run(epochs(w, Mixup(**mixup_args)), usual)


def test_a_mix_needs_one_image_field_and_one_label_field():
    images, data = ids_data()
    batches = [(images[:4], torch.arange(4), torch.arange(4))]
    mix = latecast.transforms.Mix(classes=N, mixup=0.2)
    with pytest.raises(latecast.LatecastError, match="one image field with one label field"):
        next(iter(latecast.wrap(batches, device="cpu", mix=mix)))
    w = latecast.wrap(DataLoader(data), device="cpu")
    w.mixup_enabled = False  # as timm's loader without mixing: nothing to switch off
    assert w.mixup_enabled is False and "mixup_enabled" not in vars(w.batches)


# -- the Lightning mixin -----------------------------------------------------------------


def test_the_lightning_mixin_listed_after_lightningmodule_is_one_error():
    """After LightningModule in the bases, Lightning's own ``on_after_batch_transfer``
    would run and the batches stay uint8, silently."""
    L = pytest.importorskip("lightning")
    with pytest.raises(latecast.LatecastError, match=r"list PrepareOnDevice before DataHooks"):

        class Late(L.LightningModule, PrepareOnDevice):
            pass

    class Early(PrepareOnDevice, L.LightningModule):  # the right order: no error
        def on_after_batch_transfer(self, batch, dataloader_idx):  # the user's own, on top
            return super().on_after_batch_transfer(batch, dataloader_idx)


@pytest.mark.slow
def test_the_lightning_mixin_counts_the_bytes_lightning_moved(tmp_path):
    L = pytest.importorskip("lightning")
    import torch.nn.functional as F

    images, _ = ids_data()

    class Net(PrepareOnDevice, L.LightningModule):
        def __init__(self):
            super().__init__()
            self.prepare_on_device(mean=MEAN, std=STD)
            self.lin, self.error = torch.nn.Linear(90, N), 0.0

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.error = max(self.error, (x - reference(images[y])).abs().max().item())
            return F.cross_entropy(self.lin(x.flatten(1)), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = TensorDataset(images, torch.arange(N).to(torch.uint8))  # uint8 labels: 1 byte
    net = Net()
    lightning_trainer(max_epochs=2, enable_checkpointing=False, default_root_dir=tmp_path).fit(
        net, DataLoader(data, batch_size=BATCH, shuffle=True)
    )
    s = net.latecast_stats
    assert (s.image_bytes, s.label_bytes, s.batches, s.copies) == (2 * N * 90, 2 * N, 16, 16)
    assert s.usual_bytes == s.h2d_bytes and net.error <= 1e-6


def uneven_data(n: int) -> TensorDataset:
    """``n`` uint8 NCHW images, sample ``i`` labelled ``i``: what a batch held is read off it."""
    rng = np.random.default_rng(n)
    return TensorDataset(
        torch.from_numpy(rng.integers(0, 256, (n, 3, 5, 6), dtype=np.uint8)), torch.arange(n)
    )


def end_signals(acc, loader, prepare=None) -> tuple[list[tuple], float]:
    """Per batch, what accelerate's ``gather_for_metrics`` decides by (end of data, remainder)
    and the ids it keeps; and a metric over what it keeps (the mean normalized pixel)."""
    out, values = [], []
    for x, ids in loader:
        gs = acc.gradient_state
        x = x if prepare is None else prepare(x)
        kept, means = acc.gather_for_metrics((ids, x.flatten(1).mean(1)))
        out.append((gs.end_of_dataloader, gs.remainder, kept.tolist()))
        values.append(means)
    return out, torch.cat(values).mean().item()


@pytest.fixture
def accelerator():
    """One process's ``Accelerator`` on the CPU; its singletons reset after the test."""
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState

    yield accelerate.Accelerator(cpu=True)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


class Streamed(torch.utils.data.IterableDataset):
    """An iterable dataset with a length: a DataLoader over it has no ``len()`` of its own."""

    def __init__(self, data: TensorDataset) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self):
        return iter(self.data)


@pytest.mark.parametrize(
    ("n", "batch", "streamed"), [(100, 64, False), (128, 64, False), (37, 8, True)]
)
def test_accelerate_end_of_data_is_the_batch_in_use_through_wrap(accelerator, n, batch, streamed):
    """Every batch sees the plain loader's ``end_of_dataloader`` and ``remainder`` (wrap's
    read-ahead once set them a batch early: 72 of 100 counted; with no ``len()`` it read past
    the end: 48 of 37 kept), partial last batch or not; ``prepare`` of an unsharded wrap is one
    error naming the order that works, of a sharded one the same loader."""
    data = Streamed(uneven_data(n)) if streamed else uneven_data(n)
    plain = accelerator.prepare(DataLoader(data, batch_size=batch), device_placement=[False])
    w = latecast.wrap(plain, mean=MEAN, std=STD, device="cpu")
    signals, metric = end_signals(accelerator, w)
    want, usual = end_signals(accelerator, plain, reference)
    assert signals == want and metric == pytest.approx(usual, abs=1e-6)
    assert sum((ids for *_, ids in signals), []) == list(range(n))
    assert signals[-1][:2] == (True, n % batch) and accelerator.prepare(w) is w
    with pytest.raises(latecast.LatecastError, match=r"wrap\(accelerator.prepare\(dl, dev"):
        accelerator.prepare(latecast.wrap(DataLoader(data, batch_size=batch), device="cpu"))
