"""Ray Data (issue 47): a Ray Train-style loop over ``iter_torch_batches`` (float32 batches
normalized on the host) converted as docs/dataloader.md says (``dtypes=None``, uint8 through
``wrap``): the same batches and losses within rounding, a quarter of the image bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import latecast
from latecast.errors import BatchError

ray = pytest.importorskip("ray")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
BATCH = 8


@pytest.fixture(scope="module")
def ds():
    """A ``ray.data.Dataset`` of ``{"image": uint8 (H, W, C), "label": int}`` rows, in the
    order they were given (no shuffle)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        ray.data.DataContext.get_current().execution_options.preserve_order = True
        rng = np.random.default_rng(0)
        rows = [{"image": rng.integers(0, 256, (12, 10, 3), dtype=np.uint8), "label": i % 4}
                for i in range(44)]  # fmt: skip
        yield ray.data.from_items(rows)
    finally:
        ray.shutdown()


def usual(ds) -> list[dict]:
    """The loop as Ray Train's examples write it: float32 from Ray, normalized on the host."""
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    out = []
    for b in ds.iter_torch_batches(batch_size=BATCH, dtypes=torch.float32):
        x = b["image"].permute(0, 3, 1, 2) / 255  # NHWC float32 -> NCHW in [0, 1]
        out.append({"image": (x - mean) / std, "label": b["label"].long()})
    return out


def losses(batches: list[dict], steps: int = 3) -> list[float]:
    """A few SGD steps of a tiny conv net on the batches, from one initialization."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(4, 4))  # fmt: skip
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    out = []
    for _ in range(steps):
        for b in batches:
            loss = F.cross_entropy(net(b["image"]), b["label"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
    return out


def test_a_ray_data_loop_converted_gives_its_batches_and_losses_from_uint8(ds):
    want = usual(ds)
    assert [len(b["label"]) for b in want] == [8, 8, 8, 8, 8, 4]

    # Wrapped as written, Ray's float32 images are refused: they must cross as uint8.
    as_written = ds.iter_torch_batches(batch_size=BATCH, dtypes=torch.float32)
    with pytest.raises(BatchError, match="must be uint8"):
        next(iter(latecast.wrap(as_written, mean=MEAN, std=STD, device="cpu",
                                fields={"image": "image"})))  # fmt: skip

    raw = next(iter(ds.iter_torch_batches(batch_size=BATCH, dtypes=None)))
    assert raw["image"].dtype == torch.uint8 and raw["image"].shape == (BATCH, 12, 10, 3)

    train = latecast.wrap(ds.iter_torch_batches(batch_size=BATCH, dtypes=None), mean=MEAN,
                          std=STD, device="cpu", fields={"image": "image"})  # fmt: skip
    got = list(train)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g["image"].dtype == torch.float32 and g["image"].shape == w["image"].shape
        torch.testing.assert_close(g["image"], w["image"], atol=1e-6, rtol=0)
        assert g["label"].dtype == torch.int64 and torch.equal(g["label"], w["label"])
    assert losses(got) == pytest.approx(losses(want), rel=1e-5)

    # uint8 crossed: a quarter of the float32 image bytes the usual loop hands over.
    float32_image_bytes = sum(b["image"].numel() * 4 for b in want)
    assert train.stats.image_bytes * 4 == float32_image_bytes
    assert train.stats.batches == len(want)
