"""Static batches, the fused normalize, --compile and --graph (CUDA only, refused here), the
clock, on the CPU (the CUDA halves: test_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from _helpers import one_line_error, small

import latecast
from latecast.errors import ConfigError
from latecast.loader import IGNORE, Loader
from latecast.movers import MOVERS
from latecast.trainer.loop import TrainConfig, evaluate, train
from latecast.trainer.models import build_model
from latecast.transforms import normalize

AUG = latecast.Augment(crop=2, flip=0.5, cutout=3, fill="reflect")


@pytest.mark.parametrize("transfer", list(MOVERS))
def test_static_batches_are_one_storage_and_equal_the_ordinary_loader(transfer):
    """Two augmented epochs: the static loader's two buffers hold exactly what the ordinary
    loader (its last partial batch dropped) yields for the same seed."""
    ds = small(shape=(8, 8, 3))
    kw = dict(device="cpu", transfer=transfer, seed=5, augment=AUG, channels_last=True)
    ordinary = Loader(ds, 64, drop_last=True, **kw)
    static = Loader(ds, 64, static=True, **kw)
    assert len(static) == len(ordinary) == 300 // 64
    for _ in range(2):
        want = [(x.clone(), y.clone()) for x, y in ordinary]
        got, storage = [], set()
        for x, y in static:
            storage.add((x.data_ptr(), y.data_ptr()))
            assert x.shape == (64, 3, 8, 8) and x.is_contiguous(memory_format=torch.channels_last)
            got.append((x.clone(), y.clone()))
        assert len(storage) == 1 and len(got) == len(want) == 4
        for (wx, wy), (gx, gy) in zip(want, got):
            assert torch.equal(wx, gx) and torch.equal(wy, gy)
    assert static.epoch == ordinary.epoch == 2


def test_staged_then_fill_is_the_same_batch_as_iterating():
    """What a CUDA graph replays (``staged`` on the host, ``fill`` on the device) gives the
    batches plain iteration gives, in the same buffers, and resumes at a position."""
    ds = small(shape=(8, 8, 3))
    plain = Loader(ds, 32, device="cpu", transfer="resident", seed=2, augment=AUG, static=True)
    want = [(x.clone(), y.clone()) for x, y in plain]
    split = Loader(ds, 32, device="cpu", transfer="resident", seed=2, augment=AUG, static=True)
    for k, (x, y) in enumerate(split.staged()):
        fx, fy = split.fill()
        assert fx.data_ptr() == x.data_ptr() and fy.data_ptr() == y.data_ptr()
        assert torch.equal(fx, want[k][0]) and torch.equal(fy, want[k][1])
    resumed = Loader(ds, 32, device="cpu", transfer="resident", seed=2, augment=AUG, static=True)
    resumed.load_state_dict({**split.state_dict(), "epoch": 0, "position": 5})
    tail = [(x.clone(), y.clone()) for x, y in resumed]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(tail, want[5:])) and len(tail) == 4


def test_staged_needs_a_static_resident_training_loader():
    for kw in (dict(transfer="uint8", static=True), dict(static=False), dict(pad=False)):
        loader = Loader(small(shape=(8, 8, 3)), 32, device="cpu", **{"transfer": "resident", **kw})
        with pytest.raises(ConfigError, match="staged"):
            loader.staged()


@pytest.mark.parametrize("transfer", ["resident", "uint8"])
def test_padded_static_evaluation_counts_exactly(transfer):
    """The last test batch is padded to the batch size with labels IGNORE; the counts equal
    the ordinary loader's, over one process and over three ranks' unpadded shares."""
    test = small(n=257, shape=(8, 8, 1), seed=1)
    torch.manual_seed(0)
    model = build_model("cnn", (1, 8, 8), 10)
    model(torch.zeros(4, 1, 8, 8))  # BatchNorm's running statistics move off their defaults
    ordinary = evaluate(model, Loader(test, 100, device="cpu", shuffle=False, pad=False))
    kw = dict(device="cpu", shuffle=False, pad=False, static=True)
    loader = Loader(test, 100, transfer=transfer, **kw)
    labels = [y.clone() for _, y in loader]
    assert [len(y) for y in labels] == [100, 100, 100]
    assert [(y == IGNORE).sum().item() for y in labels] == [0, 0, 43]
    assert evaluate(model, loader) == ordinary and ordinary[1] == 257
    shares = [
        evaluate(model, Loader(test, 64, transfer=transfer, rank=r, world_size=3, **kw))
        for r in range(3)
    ]
    assert tuple(map(sum, zip(*shares))) == ordinary


def test_normalize_is_one_op_into_a_given_buffer():
    """The fused normalize writes into ``out`` (its dtype and layout) and equals the result
    it allocates itself, for every dtype and layout."""
    x = torch.randint(0, 256, (6, 5, 7, 3), dtype=torch.uint8)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for fmt in (torch.contiguous_format, torch.channels_last):
            out = torch.empty(6, 3, 5, 7, dtype=dtype).contiguous(memory_format=fmt)
            got = normalize(x, mean, std, out=out)
            assert got.data_ptr() == out.data_ptr() and got.is_contiguous(memory_format=fmt)
            cl = fmt == torch.channels_last
            assert torch.equal(got, normalize(x, mean, std, dtype=dtype, channels_last=cl))
            want = (x.permute(0, 3, 1, 2).double() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / (
                torch.tensor(std).view(1, 3, 1, 1)
            )
            tol = 1e-6 if dtype == torch.float32 else 1e-2
            assert (got.double() - want).abs().max().item() <= tol * max(1, want.abs().max())
    with pytest.raises(ConfigError, match="out must be"):
        normalize(x, mean, std, out=torch.empty(6, 3, 7, 5))
    big = torch.randint(0, 256, (50, 64, 64, 3), dtype=torch.uint8)  # 2 chunks on the CPU
    one_by_one = torch.cat([normalize(big[i : i + 1], mean, std) for i in range(50)])
    assert torch.equal(normalize(big, mean, std), one_by_one)


def test_graph_is_refused_on_the_cpu_in_one_line(tmp_path, run_cli):
    proc = run_cli("train", "--graph", "--device", "cpu", "--output-dir", tmp_path / "g")
    one_line_error(proc, "--graph", "CUDA", "cpu")
    assert not (tmp_path / "g").exists()  # refused before anything was written


def test_a_batch_larger_than_the_training_split_is_refused(tmp_path):
    out = str(tmp_path)
    config = TrainConfig(
        model="mlp", limit_train=500, batch_size=1024, device="cpu", output_dir=out
    )
    with pytest.raises(
        ConfigError, match="batch_size 1024 is larger than the 500 training samples"
    ):
        train(config)


def test_clock_and_startup_are_reported_apart(tmp_path, run_cli):
    proc = run_cli(
        "train", "--model", "mlp", "--epochs", "2", "-b", "256", "--limit-train", "1024",
        "--limit-test", "300", "--eval-batch-size", "128", "--device", "cpu",
        "--output-dir", tmp_path, "--json",
    )  # fmt: skip
    assert proc.rc == 0, proc.err
    r = proc.json
    assert r["step"] == 8 and r["train_seconds"] > 0 and r["test_accuracy"] > 0.3
    assert r["clock_seconds"] == pytest.approx(r["train_seconds"] + r["final_eval_seconds"])
    assert 0 < r["final_eval_seconds"] < r["eval_seconds"]  # two evaluations, the last one final
    assert set(r["startup"]) == {"set_up", "upload", "warm_up"}
    assert r["startup_seconds"] == pytest.approx(sum(r["startup"].values()))
    assert r["save_seconds"] > 0 and r["compile"] is False and r["graph"] is False
    assert "clock" in proc.out and "start-up" in proc.out


@pytest.mark.slow
def test_compiled_training_on_the_cpu_matches_eager(tmp_path, run_cli):
    """``--compile`` (torch.compile of model and loss, compiled in the warm-up, off the clock)
    trains a short run to what the eager step reaches, within float rounding."""
    args = ["train", "--model", "cnn", "--epochs", "1", "-b", "128", "--limit-train", "512",
            "--limit-test", "500", "--device", "cpu", "--json"]  # fmt: skip
    eager = run_cli(*args, "--output-dir", tmp_path / "eager")
    fast = run_cli(*args, "--compile", "--output-dir", tmp_path / "compiled")
    assert eager.rc == 0 and fast.rc == 0, eager.err + fast.err
    assert fast.json["compile"] is True and fast.json["step"] == eager.json["step"] == 4
    # the compilation happened in the warm-up, before the first step
    assert fast.json["startup"]["warm_up"] > 5 * eager.json["startup"]["warm_up"]
    loss = [
        float((tmp_path / d / "metrics.jsonl").read_text().split('"train_loss": ')[1].split(",")[0])
        for d in ("eager", "compiled")
    ]
    assert loss[0] == pytest.approx(loss[1], rel=1e-3)
    assert fast.json["test_accuracy"] == pytest.approx(eager.json["test_accuracy"], abs=0.02)


def test_the_graphed_step_body_trains_like_train_step(monkeypatch):
    """What ``--graph`` captures, run eagerly (``fill``, ``nesterov_sgd``), follows
    ``train_step`` with ``torch.optim.SGD`` within rounding, schedule included."""
    from latecast.trainer import graphed
    from latecast.trainer.loop import model_and_optimizer, resolve_config, train_step

    ds = small(n=200, shape=(8, 8, 1))
    cpu = torch.device("cpu")
    config = resolve_config(
        TrainConfig(model="cnn", epochs=2, batch_size=64, augment="crop=2,flip", lr=0.2), ds, cpu
    )
    runs = []
    for use_graph in (False, True):
        torch.manual_seed(0)
        loader = Loader(ds, 64, device="cpu", transfer="resident", static=True, augment=AUG)
        model, opt, sched = model_and_optimizer(config, ds, cpu, len(loader))
        losses = []
        if use_graph:
            monkeypatch.setattr(graphed.GraphedStep, "_warm_up", lambda self: None)
            step = graphed.GraphedStep(model, opt, sched, loader, graphed_loss, config)
            for _ in range(config.epochs):
                for _ in loader.staged():
                    model.zero_grad(set_to_none=True)
                    step.lr.fill_(opt.param_groups[0]["lr"])
                    losses.append(step.body())
                    sched.step()
        else:
            for _ in range(config.epochs):
                for x, y in loader:
                    losses.append(train_step(model, opt, sched, x, y, config))
        runs.append((torch.stack(losses), model.state_dict(), opt.state_dict()))
    (la, wa, oa), (lb, wb, ob) = runs
    assert len(la) == 2 * 3 and not torch.equal(la[0], la[-1])
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-6)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6, msg=k)
    momentum = [s["momentum_buffer"] for s in oa["state"].values()]
    torch.testing.assert_close(momentum, [s["momentum_buffer"] for s in ob["state"].values()])
    assert oa["param_groups"][0]["lr"] == ob["param_groups"][0]["lr"]


def graphed_loss(model, images, labels, label_smoothing, amp):
    from latecast.trainer.loop import loss_of

    return loss_of(model, images, labels, label_smoothing, amp)
