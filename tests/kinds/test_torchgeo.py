"""TorchGeo's EuroSAT loop converted as docs/dataloader.md says (issue 47): the real
``torchgeo.datasets.EuroSAT`` over 13-band uint16 GeoTIFFs in its own on-disk layout,
written tiny with rasterio. The unconverted loop moves the dataset's float32 tiles and
normalizes them per band on the device as ``EuroSATDataModule`` does (kornia's
``AugmentationSequential(Normalize(MEAN, STD))``); the converted one casts them back to the
stored uint16 in the dataset's ``transforms=`` (EuroSAT casts to float32 itself) and
declares ``latecast.image16(mean=MEAN, std=STD)``. Same batches within rounding, same
losses, half the image bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _helpers import lightning_trainer
from torch.utils.data import DataLoader

import latecast
from latecast import PrepareOnDevice
from latecast.errors import ConfigError

torchgeo = pytest.importorskip("torchgeo")
import kornia.augmentation as K  # noqa: E402
import lightning as L  # noqa: E402
import rasterio  # noqa: E402
from rasterio.transform import from_origin  # noqa: E402
from torchgeo.datamodules import EuroSATDataModule  # noqa: E402
from torchgeo.datamodules.eurosat import MEAN, STD  # noqa: E402
from torchgeo.datasets import EuroSAT  # noqa: E402

CLASSES = ("AnnualCrop", "Forest", "River")
BANDS = EuroSAT.all_band_names  # B01..B12, B8A: the order of the 13 bands in each file


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """EuroSAT's layout: ``ds/images/.../tif/<Class>/<Class>_<n>.tif`` (13 bands, uint16,
    8x8 here, 64x64 in the real set) and ``eurosat-train.txt`` naming the split's files as
    ``.jpg`` (and ``eurosat-val.txt``). Band 4 tells the classes apart; values reach past
    32767 (the sign bit)."""
    root = tmp_path_factory.mktemp("eurosat")
    rng, names = np.random.default_rng(0), []
    for label, name in enumerate(CLASSES):
        folder = root.joinpath(EuroSAT.base_dir, name)
        folder.mkdir(parents=True)
        for n in range(1, 9):
            tile = rng.integers(0, 6000, (13, 8, 8)).astype(np.uint16)
            tile[3] += np.uint16(3000 * label)
            tile[0, 0, 0] = 40000
            meta = dict(
                driver="GTiff",
                height=8,
                width=8,
                count=13,
                dtype="uint16",
                crs="EPSG:32631",
                transform=from_origin(5e5, 5.5e6, 10, 10),
            )
            with rasterio.open(folder / f"{name}_{n}.tif", "w", **meta) as f:
                f.write(tile)
            names.append(f"{name}_{n}.jpg")
    (root / "eurosat-train.txt").write_text("\n".join(n for n in names if n[-5] < "7"))
    (root / "eurosat-val.txt").write_text("\n".join(n for n in names if n[-5] >= "7"))
    return str(root)


def as_stored(sample: dict) -> dict:
    """The conversion's one change to the dataset: EuroSAT gives float32 tiles; their values
    are the files' uint16 ones, so the cast back is exact."""
    sample["image"] = sample["image"].to(torch.uint16)
    return sample


def classifier() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(13, 8, 3),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, len(CLASSES)),
    )


def train(batches, prepare) -> list[float]:
    """A few SGD steps of a small classifier on ``prepare(batch)``'s images and labels."""
    net = classifier()
    opt, losses = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), []
    for _ in range(3):
        for batch in batches:
            x, y = prepare(batch)
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


@pytest.mark.parametrize("doctors", [False, True], ids=["per-band", "as-doctor-says"])
def test_eurosat_converted_as_the_docs_say_gives_the_same_batches_and_losses(root, doctors):
    """Per band in the declaration (the loop's normalize dropped), or as doctor says:
    ``image16(mean=0, std=1, channels=13)``, the values as floats, the loop's normalize kept."""
    mean, std = [MEAN[b] for b in BANDS], [STD[b] for b in BANDS]
    orders = [torch.Generator(), torch.Generator()]  # the same shuffle for both loops
    usual = DataLoader(EuroSAT(root), batch_size=6, shuffle=True, generator=orders[0])
    norm = K.Normalize(mean=torch.tensor(mean), std=torch.tensor(std))
    aug = K.AugmentationSequential(norm, data_keys=None, keepdim=True)  # EuroSATDataModule's

    def normalized(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        batch = aug(batch)  # the DataModule's on_after_batch_transfer
        return batch["image"], batch["label"]

    # the conversion: the dataset's transforms=, and one declaration in wrap
    ours = EuroSAT(root, transforms=as_stored)
    dl = DataLoader(ours, batch_size=6, shuffle=True, generator=orders[1])
    stats = {"mean": 0, "std": 1, "channels": 13} if doctors else {"mean": mean, "std": std}
    train_dl = latecast.wrap(dl, fields={"image": latecast.image16(**stats)})
    ours_normalized = normalized if doctors else lambda b: (b["image"], b["label"])

    for g in orders:
        g.manual_seed(0)
    for a, b in zip(map(normalized, usual), map(ours_normalized, train_dl)):
        assert b[0].dtype == torch.float32 and b[0].shape == (6, 13, 8, 8)
        torch.testing.assert_close(b[0].cpu(), a[0], atol=1e-5, rtol=1e-6)
        assert torch.equal(b[1].cpu(), a[1])
    assert train_dl.stats.image_bytes == 18 * 13 * 8 * 8 * 2  # uint16, half of float32

    for g in orders:
        g.manual_seed(0)
    before = train(usual, normalized)
    after = train(train_dl, ours_normalized)
    assert before[-1] < before[0]  # it learns
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)


class Classifier(L.LightningModule):
    """The usual LightningModule: its ``batch["image"]`` arrives normalized."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.losses = classifier(), []

    def training_step(self, batch: dict, index: int) -> torch.Tensor:
        loss = F.cross_entropy(self.net(batch["image"]), batch["label"])
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class Prepared(PrepareOnDevice, Classifier):
    """The conversion: the DataModule's normalize, per band in stored units, on the device."""

    def __init__(self) -> None:
        super().__init__()
        mean, std = [MEAN[b] for b in BANDS], [STD[b] for b in BANDS]
        self.prepare_on_device(fields={"image": latecast.image16(mean=mean, std=std)})


class EuroSAT16(EuroSATDataModule):
    """The conversion: Lightning runs a DataModule's hook in place of the model's."""

    on_after_batch_transfer = L.LightningDataModule.on_after_batch_transfer


def fit(model: L.LightningModule, data: type, **kwargs) -> L.LightningModule:
    torch.manual_seed(0)  # the DataModule's shuffle
    dm = data(batch_size=6, **kwargs)
    lightning_trainer(max_epochs=3, enable_checkpointing=False).fit(model, datamodule=dm)
    return model


def test_eurosat_datamodule_under_a_trainer_converted_trains_the_same(root):
    """TorchGeo's usual program, ``Trainer().fit(model, datamodule=EuroSATDataModule(...))``,
    converted: the dataset's ``transforms=``, the DataModule's hook dropped, the model's
    ``prepare_on_device``. The same losses."""
    before = fit(Classifier(), EuroSATDataModule, root=root).losses
    after = fit(Prepared(), EuroSAT16, root=root, transforms=as_stored).losses
    assert len(before) == 9 and before[-1] < before[0]  # 3 epochs of 3 batches; it learns
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)


def test_a_datamodule_hook_that_would_take_the_batch_is_refused_naming_the_change(root):
    """With TorchGeo's own hook in place, Lightning runs it instead of PrepareOnDevice's: its
    kornia ``Normalize`` got the packed batch (a raw ``ValueError`` from kornia); now one
    ``ConfigError`` naming the DataModule and the line that drops the hook."""
    change = r"EuroSATDataModule.on_after_batch_transfer .*= LightningDataModule.on_after_"
    with pytest.raises(ConfigError, match=change):
        fit(Prepared(), EuroSATDataModule, root=root, transforms=as_stored)


UNCONVERTED = """
import kornia.augmentation as K
import torch
from torch.utils.data import DataLoader
from torchgeo.datamodules.eurosat import MEAN, STD
from torchgeo.datasets import EuroSAT

bands = EuroSAT.all_band_names
mean, std = torch.tensor([MEAN[b] for b in bands]), torch.tensor([STD[b] for b in bands])
norm = K.AugmentationSequential(K.Normalize(mean=mean, std=std), data_keys=None, keepdim=True)
net = torch.nn.Sequential(torch.nn.Conv2d(13, 8, 3), torch.nn.Flatten(), torch.nn.LazyLinear(3))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for batch in DataLoader(EuroSAT(ROOT), batch_size=6, shuffle=True):
    batch = norm({k: v.to("cpu") for k, v in batch.items()})  # MOVE
    loss = torch.nn.functional.cross_entropy(net(batch["image"]), batch["label"])
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_doctor_on_the_unconverted_loop_tells_image16_as_stored(root, tmp_path, run_cli):
    """EuroSAT's float32 tiles hold the files' uint16 values: doctor names ``image16`` and
    the conversion the first test trains the same with, not a bare "move them as integers"."""
    script = tmp_path / "train.py"
    script.write_text(UNCONVERTED.replace("ROOT", repr(root)))
    res = run_cli("doctor", "--steps", "3", "--json", "--", script)
    assert res.rc == 0, res.err
    line = 1 + next(i for i, x in enumerate(UNCONVERTED.splitlines()) if "# MOVE" in x)
    at = f"{script}:{line}"
    image = next(s for s in res.json["sites"] if s["site"] == at and s["dtype"] == "float32")
    assert image["shape"] == [6, 13, 8, 8] and image["could_cross"] in ("uint16", "int16")
    assert "latecast.image16(mean=0, std=1, channels=13)" in image["change"]
    assert 'casts `sample["image"]` back to torch.' in image["change"]
