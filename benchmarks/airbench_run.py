"""airbench94 (the public ``airbench`` package, release 0.1.8) on prepared CIFAR-10 files:
its warm-up run, then one run per seed (CUDA only).

    python benchmarks/airbench_run.py DATA --package airbench-0.1.8.tar.gz --seeds 1 2 3

DATA holds ``cifar10/train.pt`` and ``cifar10/test.pt`` (``benchmarks/peer_data.py``
writes them); ``--package`` is the source distribution (or its extracted folder), used
without installing. Each run's accuracy and time are airbench's own, as it prints them:
``tta_val_acc`` (test accuracy with its test-time augmentation) and ``total_time_seconds``
(CUDA events around the whitening init, the training epochs and that final evaluation; its
per-epoch logging evaluations are outside). One JSON line per run, then a summary line.
Exits 77 (benchmarks/gpu_check.sh records "skipped") where torch sees no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

from latecast.storage.download import extract_tar

NO_DEVICE = 77


def import_airbench(package: Path, scratch: Path):
    """``airbench`` from its sdist (extracted into ``scratch``, links and ``..`` refused) or
    from an extracted folder."""
    if package.is_file():
        with tarfile.open(package) as tar:
            names = {m.name for m in tar.getmembers() if m.isfile()}
        extract_tar(package, scratch, names)
        package = scratch / package.name.removesuffix(".tar.gz")
    sys.path.insert(0, str(package))
    import airbench

    return airbench


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", type=Path, help="folder holding cifar10/train.pt and cifar10/test.pt")
    p.add_argument("--package", type=Path, required=True, help="airbench-0.1.8.tar.gz or folder")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("airbench94 needs a CUDA device; not run", file=sys.stderr)
        return NO_DEVICE
    with tempfile.TemporaryDirectory() as scratch:
        airbench = import_airbench(args.package.resolve(), Path(scratch))
        from airbench import utils

        os.chdir(args.data)  # CifarLoader reads cifar10/*.pt relative to the working directory
        final: dict = {}
        show = utils.print_training_details

        def keep_final(variables: dict, is_final_entry: bool) -> None:
            if is_final_entry:
                final.update(
                    accuracy=variables["tta_val_acc"], seconds=variables["total_time_seconds"]
                )
            show(variables, is_final_entry)

        utils.print_training_details = keep_final  # train() looks it up at each call
        airbench.warmup94()
        runs = []
        for seed in args.seeds:
            torch.manual_seed(seed)
            final.clear()
            airbench.train94(run=seed)
            runs.append({"tool": "airbench94", "seed": seed, **final})
            print(json.dumps(runs[-1]), flush=True)
    accuracy = [r["accuracy"] for r in runs]
    seconds = [r["seconds"] for r in runs]
    print(
        json.dumps(
            {
                "tool": "airbench94",
                "runs": runs,
                "mean_accuracy": statistics.mean(accuracy),
                "mean_seconds": statistics.mean(seconds),
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
