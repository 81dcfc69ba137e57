"""MONAI's spleen tutorial converted as docs/dataloader.md says (issue 47): the windowing
moved to ``latecast.image16(window=(-57, 164))``, slices int16 through MONAI's crops, whose
thresholds now read stored HU: left as they were the crops differ, rewritten (``x > -57``)
the batches and losses are the tutorial's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import latecast

monai = pytest.importorskip("monai")
from monai.data import list_data_collate  # noqa: E402
from monai.transforms import (  # noqa: E402
    Compose,
    CropForegroundd,
    RandCropByPosNegLabeld,
    ScaleIntensityRanged,
)
from monai.utils import set_determinism  # noqa: E402

LOW, HIGH = -57, 164  # the tutorial's a_min, a_max
SIZE = 16  # its spatial_size, shrunk to the tiny slices


def ct_slices(n: int = 6, h: int = 48, w: int = 40, seed: int = 0) -> list[dict]:
    """int16 HU images and int64 labels: a soft-tissue body with a rim of fat just above the
    window's floor (foreground to the tutorial) in air, a small organ inside."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w]
    out = []
    for _ in range(n):
        cy, cx = h / 2 + rng.uniform(-4, 4), w / 2 + rng.uniform(-4, 4)
        ry, rx = rng.uniform(15, 20), rng.uniform(12, 16)
        r = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2
        image = np.full((h, w), -1000, np.int16)
        image[r <= 1] = rng.integers(-50, 0, int((r <= 1).sum()))  # fat
        image[r <= 0.6] = rng.integers(-57, 400, int((r <= 0.6).sum()))  # soft tissue
        organ = ((yy - cy - 2) / 4) ** 2 + ((xx - cx + 3) / 3) ** 2 <= 1
        image[organ] = rng.integers(40, 120, int(organ.sum()))
        out.append({"image": image[None].copy(), "label": organ[None].astype(np.int64)})
    return out


class Slices(Dataset):
    def __init__(self, data: list[dict], transform: Compose):
        self.data, self.transform = data, transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return self.transform(dict(self.data[i]))


def crops(select_fn, image_threshold: float) -> list:
    """The tutorial's two intensity-reading crops, thresholds as given."""
    return [
        CropForegroundd(["image", "label"], source_key="image", select_fn=select_fn),
        RandCropByPosNegLabeld(["image", "label"], "label", spatial_size=(SIZE, SIZE), pos=1,
                               neg=1, num_samples=2, image_key="image",
                               image_threshold=image_threshold),
    ]  # fmt: skip


def loader(transforms: list) -> DataLoader:
    set_determinism(seed=0)
    pipeline = Compose(transforms)
    pipeline.set_random_state(seed=3)
    return DataLoader(Slices(ct_slices(), pipeline), batch_size=3, collate_fn=list_data_collate)


def unconverted() -> list[dict]:
    """The tutorial as its users wrote it: windowed to [0, 1] float32 on the host, then
    ``CropForegroundd`` (``x > 0``) and ``RandCropByPosNegLabeld(image_threshold=0)``."""
    scale = ScaleIntensityRanged("image", a_min=LOW, a_max=HIGH, b_min=0.0, b_max=1.0, clip=True)
    dl = loader([scale, *crops(lambda x: x > 0, 0)])
    return [{"image": b["image"].as_tensor().float(), "label": b["label"].as_tensor()} for b in dl]


def converted(select_fn, image_threshold: float) -> list[dict]:
    """As docs/dataloader.md says: ``ScaleIntensityRanged`` dropped, int16 through the same
    crops, windowed on the device by ``image16``, the label a mask."""
    dl = loader(crops(select_fn, image_threshold))
    fields = {"image": latecast.image16(window=(LOW, HIGH)), "label": "mask"}
    return list(latecast.wrap(dl, device="cpu", fields=fields))


def losses(batches: list[dict], steps: int = 4) -> list[float]:
    """A few SGD steps of a tiny conv net on the batches, from one initialization."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(4, 2, 1))  # fmt: skip
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    out = []
    for _ in range(steps):
        for b in batches:
            loss = F.cross_entropy(net(b["image"]), b["label"][:, 0].long())
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
    return out


def test_monais_spleen_crops_read_stored_units_after_the_conversion_and_match_in_them():
    want = unconverted()
    assert want and all(b["image"].shape == (6, 1, SIZE, SIZE) for b in want)

    # The fault: the thresholds as the tutorial wrote them now read HU, so the foreground
    # box loses the fat rim (-50..-1 HU) in every slice and the batches are other crops.
    for s in ct_slices():
        windowed = ScaleIntensityRanged("image", LOW, HIGH, 0.0, 1.0, clip=True)(dict(s))
        as_was = CropForegroundd("image", source_key="image")(windowed)["image"].shape
        raw = CropForegroundd("image", source_key="image")(dict(s))["image"].shape
        fixed = CropForegroundd("image", source_key="image", select_fn=lambda x: x > LOW)
        assert raw != as_was and fixed(dict(s))["image"].shape == as_was
    faulty = converted(lambda x: x > 0, 0)
    assert len(faulty) == len(want)
    assert not all(torch.allclose(g["image"], w["image"], atol=1e-6) for g, w in zip(faulty, want))

    # Rewritten in stored units: the same crops, the same batches, the same losses.
    got = converted(lambda x: x > LOW, LOW)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g["image"].dtype == torch.float32
        torch.testing.assert_close(g["image"], w["image"], atol=1e-6, rtol=0)
        assert torch.equal(g["label"], w["label"])
    assert losses(faulty) != pytest.approx(losses(want), rel=1e-5)
    assert losses(got) == pytest.approx(losses(want), rel=1e-5)
