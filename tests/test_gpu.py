"""CUDA-only checks: pinned buffers, async copies equal sync ones, the prefetch stream,
resident memory checks. Skipped where torch sees no CUDA device."""

from __future__ import annotations

import pytest
import torch

import latecast
from latecast import transfer
from latecast.errors import DeviceError
from latecast.loader import Loader

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def mnist():
    return latecast.load_dataset("mnist", "train")


def _batches(ds, name, device, n=6, **kw):
    loader = Loader(ds, 512, device=device, transfer=name, seed=11, **kw)
    out = []
    for images, labels in loader:
        out.append((images.cpu(), labels.cpu()))
        if len(out) == n:
            break
    return loader, out


def test_staging_buffers_are_pinned(mnist):
    loader = Loader(mnist, 256, device="cuda", transfer="prefetch")
    for _, _ in zip(range(4), loader):  # three slots, each filled at least once
        pass
    assert all(buf is not None and buf.is_pinned() for buf in loader._mover.ring.buffers)


@pytest.mark.parametrize("name", ["float32", "uint8", "prefetch", "resident"])
def test_cuda_batches_equal_cpu_batches(mnist, name):
    _, cpu = _batches(mnist, "float32", "cpu")
    _, gpu = _batches(mnist, name, "cuda")
    for (cx, cy), (gx, gy) in zip(cpu, gpu):
        assert torch.equal(cy, gy)
        assert (cx - gx).abs().max().item() <= 1e-6, name


def test_async_copy_survives_buffer_reuse_under_load(mnist):
    """Slow consumer work on the main stream while the side stream refills buffers: every
    batch must still equal the synchronous result (events guard the pinned slots)."""
    _, sync = _batches(mnist, "float32", "cpu", n=12)
    loader = Loader(mnist, 512, device="cuda", transfer="prefetch", seed=11)
    big = torch.randn(2048, 2048, device="cuda")
    for k, ((images, labels), (sx, sy)) in enumerate(zip(loader, sync)):
        for _ in range(5):
            big = big @ big.T / 2048  # keep the GPU busy so copies and compute overlap
        assert torch.equal(labels.cpu(), sy)
        assert (images.cpu() - sx).abs().max().item() <= 1e-6, k


def test_prefetch_copies_on_a_side_stream(mnist):
    loader = Loader(mnist, 256, device="cuda", transfer="prefetch")
    it = iter(loader)
    next(it)
    next(it)
    assert sum(loader._mover.ring.used) >= 2  # copies recorded their slots' events
    assert loader.stats.copies >= 2


def test_explicit_resident_that_does_not_fit_is_refused(mnist, monkeypatch):
    monkeypatch.setattr(transfer, "RESIDENT_FRACTION", 1e-9)
    with pytest.raises(DeviceError, match="MiB"):
        next(iter(Loader(mnist, 256, device="cuda", transfer="resident")))
    assert Loader(mnist, 256, device="cuda", transfer="auto").transfer == "prefetch"


def test_auto_is_resident_when_it_fits(mnist):
    assert Loader(mnist, 256, device="cuda").transfer == "resident"


def test_bf16_channels_last_on_cuda(mnist):
    _, cpu = _batches(mnist, "float32", "cpu", n=1)
    _, gpu = _batches(mnist, "resident", "cuda", n=1, dtype=torch.bfloat16, channels_last=True)
    assert gpu[0][0].dtype == torch.bfloat16
    torch.testing.assert_close(gpu[0][0], cpu[0][0].to(torch.bfloat16))  # 1 bf16 ulp
