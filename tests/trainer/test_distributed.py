"""Real 2-process training under ``torchrun`` (gloo, CPU, a timeout). This file is the
worker script (``_worker``): it runs ``latecast train`` unchanged and observes it, or makes
rank 1 die or hang for the fault tests."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # each test starts torchrun and two Python processes

TIMEOUT = 180  # seconds for one torchrun launch; a hang fails instead of blocking CI
# cnn (BatchNorm) on 257 train samples: one padded index, shards of 129; 301 test samples:
# unequal unpadded shards of 151 and 150.
# -b 43: 129 samples per rank = 3 full batches: training drops no partial batch
ARGS = "train --model cnn --epochs 2 -b 43 --lr 0.05 --limit-train 257 --limit-test 301"
ARGS = [*ARGS.split(), *"--device cpu --no-progress --checkpoint-every 4 --dist-timeout 60".split()]


def torchrun(
    out: Path, *args: str, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    run = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd = [sys.executable, *run, "--monitor-interval=0.1", __file__, *args]
    cmd += ["--output-dir", str(out)]
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ, **(env or {})}
    )
    return proc, time.monotonic() - t0


def test_two_ranks_share_data_train_identical_weights_and_evaluate_exactly(tmp_path):
    from torch.utils.data import DistributedSampler

    from latecast.loader import Loader
    from latecast.storage.datasets import load_dataset
    from latecast.trainer.checkpoint import load_checkpoint
    from latecast.trainer.loop import evaluate
    from latecast.trainer.models import build_model

    proc, _ = torchrun(tmp_path, *ARGS, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]

    # Row 23: DistributedSampler's order on every rank, equal shares, full coverage.
    for epoch in ("0", "1"):
        seen = [r["indices"][epoch] for r in ranks]
        for rank, indices in enumerate(seen):
            sampler = DistributedSampler(range(257), num_replicas=2, rank=rank, seed=0)
            sampler.set_epoch(int(epoch))
            assert indices == list(sampler)
        assert len(seen[0]) == len(seen[1]) == 129
        assert set(seen[0]) | set(seen[1]) == set(range(257))
    assert ranks[0]["steps"] == ranks[1]["steps"] == 2 * 3  # 129 / 43 batches an epoch

    # DDP kept the ranks in step: parameters and (synchronized) BatchNorm buffers equal.
    w0, w1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert w0.keys() == w1.keys()
    for name in w0:
        assert torch.equal(w0[name], w1[name]), name

    # Rank 0 alone reported; its checkpoint holds the unwrapped model.
    assert proc.stdout.count("epoch 2/2") == 1 and proc.stdout.count('{"test_accuracy"') == 1
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and summary["rank"] == 0
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["world_size"] == 2 and state["step"] == 6
    for name in w0:
        assert torch.equal(state["model"][name], w0[name]), name

    # Row 24: the distributed accuracy is the single-process accuracy of the same weights.
    test = load_dataset("mnist", "test")
    cut = dict(
        labels=test.labels[:301], images=test.images[:301], digest=""
    )  # no SHA-256 of its own
    test = dataclasses.replace(test, **cut)
    model = build_model("cnn", (1, 28, 28), 10)
    model.load_state_dict(state["model"])
    correct, total = evaluate(
        model, Loader(test, 1000, device="cpu", shuffle=False, pad=False, rank=0, world_size=1)
    )
    assert total == 301 and summary["test_accuracy"] == correct / total


@pytest.mark.parametrize("fault", ["dies", "hangs"])
def test_a_failing_rank_makes_the_run_exit_with_an_error(fault, tmp_path):
    """Rank 1 dies (torchrun stops the rest) or hangs (rank 0 hits --dist-timeout) after 3
    steps: a clear error, never a wait forever."""
    args = [*ARGS, "--model", "mlp", "--epochs", "50", "--dist-timeout", "5"]
    proc, seconds = torchrun(tmp_path, *args, env={"LATECAST_TEST_FAULT": f"{fault}:1:3"})
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert seconds < TIMEOUT
    if fault == "hangs":
        assert "another rank failed or did not answer within 5 s" in proc.stderr, proc.stderr
    assert "epoch 50/50" not in proc.stdout


def test_ranks_with_different_data_are_refused(tmp_path):
    """Row 23: rank 1 sees one training sample fewer; both ranks stop before training."""
    proc, _ = torchrun(
        tmp_path, *ARGS, "--model", "mlp", env={"LATECAST_TEST_RANK1_ARGS": "--limit-train 256"}
    )
    assert proc.returncode != 0
    assert "ranks hold different data" in proc.stderr, proc.stderr
    assert "rank 0 [257, 301" in proc.stderr and "rank 1 [256, 301" in proc.stderr
    assert "epoch 1/2" not in proc.stdout


# -- the worker torchrun starts ----------------------------------------------------------------


def _worker(argv: list[str]) -> int:
    """Run ``latecast train`` as torchrun's rank $RANK, observing it for the tests above."""
    import importlib

    from latecast import loader
    from latecast.tools import cli

    train_mod = importlib.import_module("latecast.trainer.loop")  # the package re-exports train()
    rank = int(os.environ["RANK"])
    if rank == 1:
        argv += os.environ.get("LATECAST_TEST_RANK1_ARGS", "").split()
    record: dict = {"indices": {}, "steps": 0}

    index_batches = loader.Loader.index_batches

    def spy_indices(self):  # the training loader's share for this epoch
        batches = index_batches(self)
        if self.pad:
            record["indices"][str(self.epoch)] = torch.cat(batches).tolist() if batches else []
        return batches

    loader.Loader.index_batches = spy_indices

    models = []
    build_model = train_mod.build_model

    def keep_model(*args, **kwargs):
        models.append(build_model(*args, **kwargs))
        return models[-1]

    train_mod.build_model = keep_model

    kind, fault_rank, after = os.environ.get("LATECAST_TEST_FAULT", "none:-1:0").split(":")

    def count_step(optimizer, args, kwargs):
        record["steps"] += 1
        if rank == int(fault_rank) and record["steps"] == int(after):
            if kind == "dies":
                os._exit(1)
            time.sleep(3600)  # hangs: alive, but never joins the next collective

    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(count_step)

    out = Path(argv[argv.index("--output-dir") + 1])
    code = cli.main(argv)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    torch.save(models[0].state_dict(), out / f"rank{rank}.pt")
    return code


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
