"""CUDA-only checks: pinned buffers, async copies equal sync ones, the prefetch stream,
resident memory checks. Skipped where torch sees no CUDA device."""

from __future__ import annotations

import pytest
import torch
from _helpers import mover, one_line_error

import latecast
from latecast import movers
from latecast.errors import DeviceError
from latecast.loader import Loader

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _batches(ds, name, device, n=6, **kw):
    loader = Loader(ds, 512, device=device, transfer=mover(name), seed=11, **kw)
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
    monkeypatch.setattr(movers, "RESIDENT_FRACTION", 1e-9)
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


# -- static batches and the captured step (issue 11) -------------------------------------------


def test_static_resident_steps_never_sync_the_host(mnist):
    """After the epoch's one order upload, a static resident step (stage + fill, with
    augmentation) runs with CUDA's sync debug mode set to raise on any synchronization."""
    aug = latecast.Augment(crop=2, flip=0.5, cutout=4)
    loader = Loader(mnist, 512, device="cuda", transfer="resident", static=True, augment=aug)
    it = iter(loader)
    first, _ = next(it)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            images, labels = next(it)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert images.data_ptr() == first.data_ptr() and labels.shape == (512,)


def _snapshot(model, buffers):
    return {
        **{k: v.clone() for k, v in model.state_dict().items()},
        "momentum": [b.clone() for b in buffers],
    }


def test_replayed_step_equals_the_eager_step(mnist):
    """One replay (augmentation drawn inside the graph) gives the eager step's weights,
    BatchNorm statistics, momentum and loss; the next replay moves to the next batch."""
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True):
        _replay_vs_eager(mnist)


def _replay_vs_eager(mnist):
    from latecast.trainer.graphed import GraphedStep
    from latecast.trainer.loop import TrainConfig, loss_of, model_and_optimizer, resolve_config

    ds = type(mnist)(
        mnist.name,
        "train",
        mnist.labels[:4096],
        mnist.classes,
        mnist.mean,
        mnist.std,
        mnist.images[:4096],
    )
    device = torch.device("cuda", torch.cuda.current_device())
    config = resolve_config(
        TrainConfig(model="cnn", epochs=1, batch_size=256, augment="crop=2,flip"), ds, device
    )
    loader = Loader(
        ds,
        256,
        device=device,
        transfer="resident",
        seed=3,
        static=True,
        augment=latecast.Augment.parse(config.augment),
        channels_last=config.channels_last,
    )
    torch.manual_seed(0)
    model, opt, sched = model_and_optimizer(config, ds, device, len(loader))
    loader.start()
    step = GraphedStep(model, opt, sched, loader, loss_of, config)  # warms up, puts it back
    start = _snapshot(model, step.buffers)

    next(iter(loader.staged()))  # batch 0 staged
    model.zero_grad(set_to_none=True)
    step.lr.fill_(opt.param_groups[0]["lr"])
    eager_loss = step.body()
    eager = _snapshot(model, step.buffers)

    model.load_state_dict({k: v for k, v in start.items() if k != "momentum"})
    for b, s in zip(step.buffers, start["momentum"]):
        b.copy_(s)
    step.capture()
    loader.load_state_dict({**loader.state_dict(), "epoch": 0, "position": 0})
    staged = loader.staged()
    next(staged)  # batch 0 again
    graph_loss = step().clone()
    graphed = _snapshot(model, step.buffers)
    assert any(not torch.equal(start[k], eager[k]) for k in start if k != "momentum")
    torch.testing.assert_close(graph_loss, eager_loss, rtol=1e-5, atol=1e-6)
    for k in start:
        torch.testing.assert_close(graphed[k], eager[k], rtol=1e-5, atol=1e-6, msg=k)
    next(staged)
    assert not torch.equal(step(), graph_loss)  # batch 1: another loss


def test_graph_training_run(tmp_path, run_cli):
    """--graph end to end on a slice of MNIST: trains, reports the capture apart."""
    proc = run_cli(
        "train", "--graph", "--limit-train", "8192", "--epochs", "2", "-b", "256",
        "--device", "cuda", "--output-dir", tmp_path, "--json",
    )  # fmt: skip
    assert proc.rc == 0, proc.err
    r = proc.json
    assert r["graph"] is True and r["transfer"] == "resident" and r["step"] == 2 * 32
    assert r["test_accuracy"] > 0.9 and r["startup"]["capture"] > 0
    assert r["clock_seconds"] == pytest.approx(r["train_seconds"] + r["final_eval_seconds"])


def test_graph_needs_the_resident_transfer(tmp_path, run_cli):
    proc = run_cli(
        "train", "--graph", "--transfer", "prefetch", "--device", "cuda", "--output-dir", tmp_path
    )
    one_line_error(proc, "--graph needs the resident transfer", "prefetch")
