"""``latecast doctor`` on small training scripts written the way people write them, each
checked for its verdict and its advice applied; a doctored run computes what an undoctored
one does; every bad input of issue 17."""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
from _helpers import one_line_error

import latecast
from latecast.tools.doctor import grid

MNIST = """
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

import latecast


class MNIST(Dataset):
    def __init__(self, split, transform, limit=512):
        ds = latecast.load_dataset("mnist", split)
        self.images, self.labels = ds.images[:limit, :, :, 0], ds.labels[:limit]
        self.transform = transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(Image.fromarray(self.images[i])), int(self.labels[i])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, 2)
        self.fc = nn.Linear(4 * 13 * 13, 10)

    def forward(self, x):
        return self.fc(torch.flatten(F.relu(self.conv(x)), 1))


def main():
    parser = argparse.ArgumentParser(description="MNIST, a few steps")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train = MNIST("train", tf, limit=6 * args.batch_size)
    context = "spawn" if args.workers else None  # spawn re-imports this file: the guard below
    loader = DataLoader(train, args.batch_size, shuffle=True, num_workers=args.workers,
                        multiprocessing_context=context)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        for data, target in loader:
            data, target = data.to(device), target.to(device)  # MOVE
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            print(f"loss {loss.item()!r}")


if __name__ == "__main__":
    main()
"""

PHOTOS = """
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

tf = transforms.Compose([
    transforms.RandomResizedCrop(24),
    transforms.RandomHorizontalFlip(),
    transforms.ToTensor(),
    transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
])
loader = DataLoader(datasets.ImageFolder(sys.argv[1], tf), batch_size=8, shuffle=True)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(3):
    for images, labels in loader:
        images = images.to("cpu", non_blocking=True)  # MOVE
        labels = labels.to("cpu", non_blocking=True)
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

# nanoGPT's get_batch with the widening in the move: int32 ids made per call, cast to int64 by
# .to(device, dtype): a blocking copy converts on the host (ATen's copy_kernel_cuda), int64
# crosses; a non-blocking one converts on the device, its int32 crosses
TOKENS_CAST = """
import numpy as np
import torch
import torch.nn.functional as F

block_size, batch_size, device = 16, 4, "cpu"
data = np.memmap("train.bin", dtype=np.uint16, mode="r")
torch.manual_seed(0)


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int32)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int32))
                     for i in ix])
    z = x.to(device, torch.int64, non_blocking=True)  # ASYNC
    w = x.float().to(device, torch.int64)  # FLOATS
    x, y = x.to(device, dtype=torch.int64), y.to(device, torch.int64)  # MOVE
    return x, y


emb = torch.nn.Embedding(50304, 8)
head = torch.nn.Linear(8, 50304)
opt = torch.optim.AdamW([*emb.parameters(), *head.parameters()], lr=1e-3)
for it in range(6):
    x, y = get_batch()
    loss = F.cross_entropy(head(emb(x)).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"loss {loss.item()!r}")
"""
_CAST_MOVE = "    x, y = x.to(device, dtype=torch.int64), y.to(device, torch.int64)  # MOVE\n"
# the same without the cast: int64 ids made per call and moved as they are
TOKENS = (
    TOKENS_CAST.replace("astype(np.int32)", "astype(np.int64)")
    .replace(_CAST_MOVE, "    x, y = x.to(device), y.to(device)  # MOVE\n")
    .replace("    z = x.to(device, torch.int64, non_blocking=True)  # ASYNC\n", "")
    .replace("    w = x.float().to(device, torch.int64)  # FLOATS\n", "")
)
assert TOKENS.count("to(device") == 2 and "int32" not in TOKENS


WRAPPED = """
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import latecast

ds = latecast.load_dataset("mnist")
images = torch.from_numpy(ds.images[:256]).permute(0, 3, 1, 2)  # uint8 (N, 1, 28, 28)
dl = DataLoader(TensorDataset(images, torch.from_numpy(ds.labels[:256]).long()), 32)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in latecast.wrap(dl, mean=ds.mean, std=ds.std, device="cpu"):  # MOVE
    x, y = x.to("cpu"), y.to("cpu")  # kept from before: no move on a GPU (already there)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # torch's own moves: not counted
    opt.step()
"""

FEATURES = """
import torch
from torch.utils.data import DataLoader, TensorDataset

g = torch.Generator().manual_seed(0)
features, targets = torch.randn(256, 12, generator=g), torch.randn(256, 1, generator=g)
model = torch.nn.Linear(12, 1)
opt = torch.optim.Adam(model.parameters())
for x, y in DataLoader(TensorDataset(features, targets), batch_size=16, shuffle=True):
    x, y = x.to("cpu"), y.to("cpu")  # MOVE
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # no row for its 0-dim norms
    opt.step()
"""


def line_of(text: str, mark: str) -> int:
    return next(i for i, s in enumerate(text.splitlines(), 1) if mark in s)


def write(tmp_path: Path, name: str, text: str, mark: str | None = "# MOVE") -> tuple[Path, str]:
    """The script at ``tmp_path/name`` and the ``file:line`` of its line marked ``mark``."""
    path = tmp_path / name
    path.write_text(text)
    return path, mark and f"{path}:{line_of(text, mark)}"


def sites(result: dict, where: str) -> dict[str, dict]:
    return {s["dtype"]: s for s in result["sites"] if s["site"] == where}


def test_mnist_loop_uint8_pixels_mean_std_and_labels(tmp_path, run_cli):
    script, where = write(tmp_path, "train.py", MNIST)
    out = tmp_path / "out"
    res = run_cli("doctor", "--steps", "4", "--json", "--output-dir", out, "--", "python", script)
    assert res.rc == 0, res.err
    r = res.json
    assert r["ended"] == "steps" and r["steps"] == 4 and r["on_cpu"] and r["error"] is None
    found = sites(r, where)
    image, label = found["float32"], found["int64"]
    assert image["shape"] == [64, 1, 28, 28] and image["kind"] == "8-bit image"
    assert image["could_cross"] == "uint8" and image["factor"] == 4.0
    assert image["bytes_per_step"] == 64 * 784 * 4 and image["bytes_per_step_then"] == 64 * 784
    assert abs(image["mean"][0] - 0.1307) < 1e-6 and abs(image["std"][0] - 0.3081) < 1e-6
    assert label["range"][0] >= 0 and label["range"][1] <= 9 and label["could_cross"] == "uint8"
    assert label["factor"] == 8.0 and label["bytes_per_step"] == 64 * 8
    assert r["total"]["factor"] == (64 * 784 * 4 + 64 * 8) / (64 * 784 + 64)
    model_line = MNIST.splitlines().index("    model = Net().to(device)") + 1
    assert {s["site"] for s in r["setup"]} == {f"{script}:{model_line}"}  # once, not per step
    assert sum(s["bytes"] for s in r["setup"]) == 4 * (4 * 9 + 4 + 4 * 13 * 13 * 10 + 10)
    text = res.out
    assert where in text and "PILToTensor()" in text and "mean=(0.1307,), std=(0.3081,)" in text
    assert "would cross the bus on a GPU" in text
    assert "wants torchvision.transforms.v2.ToImage() there instead" in text  # its own dataset
    md = (out / "doctor.md").read_text()
    assert "| total" in md and "+    tf = transforms.Compose([transforms.PILToTensor()])" in md
    assert "multiprocessing_context=context), mean=(0.1307,), std=(0.3081,))" in md


def run_alone(script: Path, *argv) -> str:
    """What ``python script argv`` prints, run in this process (as doctor runs it)."""
    out, saved = io.StringIO(), sys.argv
    try:
        sys.argv = [str(script), *map(str, argv)]
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved
    return out.getvalue()


def run_each(tmp_path: Path, texts: dict[str, str], *argv) -> list[str]:
    """Each of ``texts`` written as ``tmp_path/name``, then run alone: what each printed."""
    return [run_alone(write(tmp_path, name, text, None)[0], *argv) for name, text in texts.items()]


def test_a_doctored_run_computes_exactly_what_an_undoctored_one_does(tmp_path, run_cli):
    script, _ = write(tmp_path, "train.py", MNIST)
    alone = run_alone(script, "--batch-size", "32")
    doctored = run_cli("doctor", "--steps", "100", "--", script, "--batch-size", "32")
    assert doctored.rc == 0, doctored.err
    losses = [line for line in alone.splitlines() if line.startswith("loss")]
    assert len(losses) == 6
    assert [x for x in doctored.out.splitlines() if x.startswith("loss")] == losses
    assert "the script ended" in doctored.out and "(32, 1, 28, 28)" in doctored.out


def test_image_folder_random_resized_crop(tmp_path, run_cli):
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / "photos" / cls).mkdir(parents=True)
        for i in range(8):  # 8x8 flat blocks, a quarter black: every crop holds level 0
            blocks = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            blocks[rng.random((8, 8)) < 0.25] = 0
            photo = blocks.repeat(6, axis=0).repeat(6, axis=1)
            Image.fromarray(photo).save(tmp_path / "photos" / cls / f"{i}.png")
    script, where = write(tmp_path, "photos.py", PHOTOS)
    r = run_cli("doctor", "--steps", "3", "--json", "--", script, tmp_path / "photos").json
    image = sites(r, where)["float32"]
    assert image["shape"] == [8, 3, 24, 24] and image["kind"] == "8-bit image"
    assert image["factor"] == 4.0 and image["bytes_per_step"] == 8 * 3 * 24 * 24 * 4
    assert np.allclose(image["mean"], [0.485, 0.456, 0.406], rtol=0, atol=1e-6)
    assert np.allclose(image["std"], [0.229, 0.224, 0.225], rtol=0, atol=1e-6)
    labels = next(s for s in r["sites"] if s["dtype"] == "int64")
    assert labels["could_cross"] == "uint8" and labels["range"][1] <= 1


def test_nanogpt_token_ids_cross_as_uint16(tmp_path, run_cli, monkeypatch):
    rng = np.random.default_rng(0)
    rng.integers(0, 50257, 4096, dtype=np.uint16).tofile(tmp_path / "train.bin")
    monkeypatch.chdir(tmp_path)
    script, where = write(tmp_path, "train.py", TOKENS)
    r = run_cli("doctor", "--steps", "3", "--json", "--", "python", "train.py").json
    assert len(r["sites"]) == 2  # x and y, moved on one line
    for tokens in r["sites"]:
        assert tokens["site"] == "train.py:" + where.rsplit(":")[1]
        assert tokens["shape"] == [4, 16] and tokens["calls_per_step"] == 1
        assert 32767 < tokens["range"][1] <= 50256 and tokens["could_cross"] == "uint16"
        assert tokens["factor"] == 4.0 and tokens["bytes_per_step"] == 4 * 16 * 8
    assert r["total"]["factor"] == 4.0


def test_a_loop_already_on_wrap_has_nothing_to_change(tmp_path, run_cli):
    script, where = write(tmp_path, "wrapped.py", WRAPPED)
    res = run_cli("doctor", "--steps", "3", "--json", "--", script)
    (moved,) = res.json["sites"]  # not the .to() of what wrap made, nor clip_grad_norm_'s
    assert moved["site"] == where and moved["dtype"] == "uint8" and moved["factor"] == 1.0
    assert moved["latecast"] and moved["kind"] == "latecast" and res.json["setup"] == []
    # one packed copy a batch: uint8 pixels and uint8 labels (and the batch read ahead)
    assert moved["bytes_per_step"] == 4 * 32 * (784 + 1) / 3
    assert res.json["total"]["factor"] == 1.0
    assert "nothing to change: latecast moves every batch" in res.out
    assert "what to change" not in res.out


def test_float_features_that_are_not_quantized_have_nothing_to_gain(tmp_path, run_cli):
    script, where = write(tmp_path, "regress.py", FEATURES)
    r = run_cli("doctor", "--steps", "5", "--json", "--", script).json
    assert {s["site"] for s in r["sites"]} == {where}
    assert {tuple(s["shape"]): s["kind"] for s in r["sites"]} == {
        (16, 12): "float",
        (16, 1): "float",
    }
    assert r["total"]["factor"] == 1.0 and r["total"]["bytes_per_step"] == 16 * 13 * 4


def test_a_module_runs_as_python_m_runs_it(tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, where = write(tmp_path, "regress.py", FEATURES)
    for argv in (["-m", "regress"], ["--", "python", "-m", "regress"]):
        r = run_cli("doctor", "--steps", "2", "--json", *argv).json
        assert r["steps"] == 2 and {s["site"] for s in r["sites"]} == {Path(where).name}


@pytest.mark.parametrize("channels", [1, 3])
def test_grid_recovers_mean_and_std_as_torchvision_makes_the_values(channels):
    import torch
    from torchvision import transforms

    g = torch.Generator().manual_seed(channels)
    pixels = torch.randint(0, 256, (4, channels, 16, 16), dtype=torch.uint8, generator=g)
    mean, std = torch.rand(channels, generator=g).tolist(), (torch.rand(channels) + 0.1).tolist()
    x = transforms.Normalize(mean, std)(pixels.float() / 255)
    for c in range(channels):
        m, s = grid(x[:, c].double().numpy().ravel(), torch.finfo(torch.float32).eps)
        assert abs(m - mean[c]) < 1e-6 and abs(s - std[c]) < 1e-6
    assert grid(torch.randn(4096, generator=g).double().numpy(), 1e-7) is None
    half = x.half()[:, 0].double().numpy().ravel()
    assert grid(half, torch.finfo(torch.float16).eps) is not None


# -- the advice, applied as written (issue 26) ------------------------------------------------

# pytorch/examples' mnist/main.py in its shape: one transform shared by the train and the test
# loader, train() and test() (under no_grad) per epoch, dropout drawing from the global RNG
MNIST_EXAMPLE = """
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torchvision import datasets, transforms


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(8 * 13 * 13, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        return F.log_softmax(self.fc1(x), dim=1)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)  # MOVE
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        print(f"train {epoch} {batch_idx} {loss.item()!r}")


def test(model, device, test_loader):
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)  # EVAL
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    print(f"test {test_loss!r} {correct}")


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
    parser.add_argument("--data", default="../data")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-cuda", action="store_true", default=False)
    parser.add_argument("--limit", type=int, default=0, help="the first N samples of each")
    args = parser.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if use_cuda else "cpu")
    train_kwargs = {"batch_size": args.batch_size}
    test_kwargs = {"batch_size": args.test_batch_size}
    if use_cuda:
        cuda_kwargs = {"num_workers": 1, "pin_memory": True, "shuffle": True}
        train_kwargs.update(cuda_kwargs)
        test_kwargs.update(cuda_kwargs)
    transform = transforms.Compose([
        transforms.ToTensor(),
        transforms.Normalize((0.1307,), (0.3081,))
        ])
    dataset1 = datasets.MNIST(args.data, train=True, download=False, transform=transform)
    dataset2 = datasets.MNIST(args.data, train=False, transform=transform)
    if args.limit:
        dataset1 = torch.utils.data.Subset(dataset1, range(args.limit))
        dataset2 = torch.utils.data.Subset(dataset2, range(args.limit))
    train_loader = torch.utils.data.DataLoader(dataset1, **train_kwargs)
    test_loader = torch.utils.data.DataLoader(dataset2, **test_kwargs)
    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()
    print(f"weights {sum(p.double().sum() for p in model.parameters()).item()!r}")


if __name__ == "__main__":
    main()
"""


def by_hand(text: str, normalize: str, stats: str, *loaders: str) -> str:
    """The README's conversion of ``text``, by hand: its ``normalize`` (ToTensor, Normalize)
    made PILToTensor, and each of ``loaders`` wrapped with ``stats`` before the model is made."""
    at = text.index("    model = ")
    wraps = "".join(f"    {x} = latecast.wrap({x}, **stats)\n" for x in loaders)
    text = text[:at] + f"    stats = dict({stats}, device=device)\n" + wraps + text[at:]
    return text.replace(normalize, "transforms.PILToTensor()")


MNIST_BY_HAND = by_hand(
    MNIST_EXAMPLE.replace("import argparse\n", "import argparse\n\nimport latecast\n"),
    "transforms.ToTensor(),\n        transforms.Normalize((0.1307,), (0.3081,))",
    "mean=(0.1307,), std=(0.3081,)",
    "train_loader",
    "test_loader",
)


@pytest.fixture(scope="session")
def torchvision_mnist(tmp_path_factory) -> Path:
    """A root for ``torchvision.datasets.MNIST``: latecast's bundled files, unpacked."""
    import gzip
    import shutil

    root = tmp_path_factory.mktemp("mnist-root")
    (root / "MNIST" / "raw").mkdir(parents=True)
    for packed in (Path(latecast.__file__).parent / "bundled").glob("*.gz"):
        with gzip.open(packed) as f, open(root / "MNIST" / "raw" / packed.stem, "wb") as out:
            shutil.copyfileobj(f, out)
    return root


def applied(text: str, edits: list[dict]) -> str:
    """``text`` with doctor's edits made as written: each hunk's old lines must be there."""
    lines = text.split("\n")
    for e in sorted(edits, key=lambda e: -e["line"]):
        at = slice(e["line"] - 1, e["line"] - 1 + len(e["old"]))
        assert lines[at] == e["old"], e
        lines[at] = e["new"]
    return "\n".join(lines)


def test_the_mnist_examples_advice_applied_as_written_trains_as_converted_by_hand(
    tmp_path, run_cli, torchvision_mnist, monkeypatch
):
    """Stopped before the test loader moved a batch, doctor still wraps it (shared transform):
    applied as written, the run equals the hand conversion (wrapping the train loader alone
    crashes the test pass); the converted script gets "nothing to change"."""
    monkeypatch.chdir(tmp_path)
    script, _ = write(tmp_path, "train.py", MNIST_EXAMPLE)
    # on the CPU also where there is CUDA: GPU kernels are not bitwise deterministic
    argv = ["--data", torchvision_mnist, "--limit", 192, "--epochs", 1, "--no-cuda"]
    r = run_cli("doctor", "--steps", "2", "--json", "--", "python", "train.py", *argv).json
    assert r["ended"] == "steps" and r["evaluation"] == [] and len(r["loaders"]) == 2
    assert {x["dataset"] for x in r["loaders"]} == {"torchvision.datasets.mnist.MNIST"}
    image = sites(r, f"train.py:{line_of(MNIST_EXAMPLE, '# MOVE')}")["float32"]
    made = [
        f"train.py:{line_of(MNIST_EXAMPLE, f'    {x} = ')} (`{x}`)"
        for x in ("train_loader", "test_loader")
    ]
    assert image["change"].endswith(", ".join(made)), image["change"]  # no word on numpy
    texts = {"advised.py": applied(MNIST_EXAMPLE, r["edits"]), "by_hand.py": MNIST_BY_HAND}
    alone, advised, hand = run_each(tmp_path, {"train.py": MNIST_EXAMPLE, **texts}, *argv)
    assert advised == hand
    assert len(advised.split()) == len(alone.split())
    for a, b in zip(advised.split(), alone.split()):  # train/test losses, correct, weights
        assert a == b or abs(float(a) - float(b)) <= 1e-5 * abs(float(b)), (a, b)
    assert advised.count("test ") == 1
    half = MNIST_BY_HAND.replace("    test_loader = latecast.wrap(test_loader, **stats)\n", "")
    assert half.count("latecast.wrap(") == 1
    with pytest.raises(RuntimeError, match="Input type .* and bias type .* should be the same"):
        run_each(tmp_path, {"half.py": half}, *argv)  # the advice as it was: train loader alone
    again = run_cli(
        "doctor", "--steps", "2", "--eval-steps", "1", "--json", "--", "advised.py", *argv
    )
    assert "nothing to change: latecast moves every batch" in again.out and not again.json["edits"]
    assert again.json["ended"] == "eval" and again.json["eval_batches"] == 1
    (moved,) = again.json["evaluation"]  # the test loader's one batch, through latecast
    assert moved["latecast"] and moved["calls"] == 1 and moved["dtype"] == "uint8"


# nanoGPT's train.py in its shape: configuration as globals, get_batch reading a memmap per
# call, estimate_loss under no_grad before training, dropout, clip_grad_norm_
NANOGPT = """
import os
import sys

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

data_dir = "."
eval_interval = 4
eval_iters = 2
batch_size = 4
block_size = 16
max_iters = 6
grad_clip = 1.0
device = "cuda" if torch.cuda.is_available() else "cpu"
for arg in sys.argv[1:]:  # the configurator's --key=value
    key, value = arg.removeprefix("--").split("=")
    globals()[key] = type(globals()[key])(value)
torch.manual_seed(1337)
device_type = "cuda" if "cuda" in device else "cpu"


# poor man's data loader
def get_batch(split):
    # We recreate np.memmap every batch to avoid a memory leak
    if split == "train":
        data = np.memmap(os.path.join(data_dir, "train.bin"), dtype=np.uint16, mode="r")
    else:
        data = np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i : i + block_size]).astype(np.int64)) for i in ix])
    y = torch.stack(
        [torch.from_numpy((data[i + 1 : i + 1 + block_size]).astype(np.int64)) for i in ix]
    )
    if device_type == "cuda":
        # pin arrays x,y, which allows us to move them to GPU asynchronously
        x, y = (
            x.pin_memory().to(device, non_blocking=True),
            y.pin_memory().to(device, non_blocking=True),
        )
    else:
        x, y = x.to(device), y.to(device)  # MOVE
    return x, y


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(50304, 16)
        self.drop = nn.Dropout(0.2)
        self.lm_head = nn.Linear(16, 50304)

    def forward(self, idx, targets):
        logits = self.lm_head(self.drop(self.wte(idx)))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


model = GPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


X, Y = get_batch("train")  # fetch the very first batch
iter_num = 0
while True:
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']!r}, val loss {losses['val']!r}")
    logits, loss = model(X, Y)
    X, Y = get_batch("train")  # async prefetch the next batch while the model runs
    loss.backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"iter {iter_num}: loss {loss.item()!r}")
    iter_num += 1
    if iter_num > max_iters:
        break
print(f"weights {sum(p.double().sum() for p in model.parameters()).item()!r}")
"""

# the README's conversion, by hand (examples/nanogpt_tokens.py): the Mover returns the batch
_BRANCHES = slice(
    NANOGPT.index('    if device_type == "cuda":\n'), NANOGPT.index("    return x, y\n")
)
NANOGPT_BY_HAND = (
    NANOGPT[: _BRANCHES.start].replace("import torch\n", "import torch\n\nimport latecast\n")
    + "    return mover((x, y))  # MOVE\n"
    + NANOGPT[_BRANCHES.stop + len("    return x, y\n") :]
).replace("# poor man's data loader\n", "mover = latecast.Mover(device=device)\n")


def test_nanogpts_advice_is_the_mover_applied_as_written_the_same_run(
    tmp_path, run_cli, monkeypatch
):
    """``get_batch`` gets a ``latecast.Mover`` in both device branches: applied, the run equals
    the original exactly (the Mover reads nothing ahead: global-RNG draws stay in order);
    estimate_loss's batches are evaluation rows, clip_grad_norm_'s norms no row."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 4096), ("val", 1024)):
        rng.integers(0, 50257, n, dtype=np.uint16).tofile(tmp_path / f"{split}.bin")
    monkeypatch.chdir(tmp_path)
    script, where = write(tmp_path, "train.py", NANOGPT)
    cpu = "--device=cpu"  # also where there is CUDA: its kernels are not bitwise deterministic
    r = run_cli("doctor", "--steps", "3", "--json", "--", "python", "train.py", cpu).json
    move = f"train.py:{where.rsplit(':')[1]}"
    assert {s["site"] for s in r["sites"] + r["evaluation"]} == {move}  # no clip_grad_norm_ row
    assert len(r["sites"]) == len(r["evaluation"]) == 2 and r["evaluation"][0]["calls"] == 4
    assert all("through a `latecast.Mover`" in s["change"] for s in r["sites"])
    advised = applied(NANOGPT, r["edits"])
    assert advised.count("x, y = mover((x, y))") == 2 and "pin_memory" not in advised
    texts = {"train.py": NANOGPT, "advised.py": advised, "by_hand.py": NANOGPT_BY_HAND}
    runs = run_each(tmp_path, texts, cpu)
    assert runs[0] == runs[1] == runs[2] and runs[0].count("iter ") == 7
    again = run_cli(
        "doctor", "--steps", "3", "--eval-steps", "1", "--json", "--", "advised.py", cpu
    )
    assert again.json["edits"] == [] and "nothing to change" in again.out
    assert again.json["ended"] == "training"  # no DataLoader pass to end: it trained on
    assert {s["dtype"] for s in again.json["sites"]} == {"uint8"}  # 2 bytes a token, packed


# -- bad input ----------------------------------------------


def test_a_script_or_module_that_is_not_there(tmp_path, run_cli):
    one_line_error(run_cli("doctor", "--", tmp_path / "nope.py"), "not found")
    one_line_error(run_cli("doctor", "-m", "no_such.module"), "no module named")
    one_line_error(run_cli("doctor"), "name the script")


def test_the_stop_after_steps_passes_the_scripts_own_except_exception(tmp_path, run_cli):
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import torch\n"
        "opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)\n"
        "for i in range(20):\n"
        "    try:\n"
        "        opt.step()\n"
        "    except Exception:\n"
        "        print('swallowed')\n"
    )
    res = run_cli("doctor", "--steps", "3", "--json", "--", script)
    assert res.rc == 0 and res.json["steps"] == 3 and "swallowed" not in res.out


def test_a_script_that_never_moves_a_tensor(tmp_path, run_cli):
    script = tmp_path / "quiet.py"
    script.write_text("import torch\nprint(torch.ones(2).sum().item())\n")
    res = run_cli("doctor", "--json", "--", script)
    assert res.rc == 0 and res.json["sites"] == [] and "no tensor was moved" in res.out


EDGES = """
import os
import sys
import warnings

import torch
from torch.utils.data import DataLoader, Dataset


class Broken(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            raise ValueError(f"sample {i} is broken")  # RAISE
        return torch.zeros(2)


os.makedirs("elsewhere", exist_ok=True)
os.chdir("elsewhere")
warnings.warn("ignored by -W", UserWarning)
warnings.warn("the script's own warning", FutureWarning)  # WARN
print("-u", sys.stdout.line_buffering, "-B", sys.dont_write_bytecode)
torch.ones(3).to("cpu")
for batch in DataLoader(Broken(), batch_size=2, num_workers=1, multiprocessing_context="fork"):
    batch.to("cpu")
"""


@pytest.mark.slow  # a real python -m latecast, and a DataLoader worker
def test_python_options_a_relative_output_dir_a_workers_error_and_warnings(
    tmp_path, run_cli, monkeypatch
):
    """A real process, as a user types it: the options apply to the script, its warning shows
    as Python shows it, its worker's error keeps its line, a relative --output-dir lands where
    doctor started (the script changed directory), --json carries error and exit code."""
    monkeypatch.chdir(tmp_path)
    script, _ = write(tmp_path, "edges.py", EDGES, "# RAISE")
    raise_at, warn_at = line_of(EDGES, "# RAISE"), line_of(EDGES, "# WARN")
    argv = ["--json", "--output-dir", "out", "--", "python", "-u", "-W", "ignore::UserWarning"]
    src = str(Path(latecast.__file__).parents[1])  # this latecast, from any directory
    res = run_cli("doctor", *argv, "-B", "edges.py", process=True, env={"PYTHONPATH": src})
    line = res.err.strip().splitlines()[-1]
    assert res.rc == 1 and line == (
        "latecast: error: edges.py raised ValueError in DataLoader worker process 0: "
        f"sample 3 is broken (edges.py:{raise_at})"
    ), res.err
    assert f"{script}:{warn_at}: FutureWarning: the script's own warning\n" in res.err
    assert "ignored by -W" not in res.err and "-u True -B True" in res.out
    assert res.json["error"] == line.removeprefix("latecast: error: ")
    assert res.json["exit_code"] == 1 and res.json["setup"][0]["site"] == f"edges.py:{warn_at + 2}"
    assert (tmp_path / "out" / "doctor.md").is_file() and not (
        tmp_path / "elsewhere" / "out"
    ).exists()


def test_options_that_shape_the_interpreter_say_how_to_start_doctor(tmp_path, run_cli):
    script = tmp_path / "away.py"
    script.write_text("import os, torch\nos.chdir('/')\ntorch.zeros(2).to('cpu')\n")
    for given in (["-O"], ["-X", "dev"], ["-uE"]):
        line = one_line_error(run_cli("doctor", "--", "python", *given, script))
        shown = " ".join(given) if given != ["-uE"] else "-E"
        assert f"start doctor under it, python {shown} -m latecast doctor -- SCRIPT" in line
    one_line_error(run_cli("doctor", "--", "python", "-c", "1"), "not python -c code")
    here = os.getcwd()
    res = run_cli("doctor", "--json", "--", "python", "-Walways", script)
    assert res.rc == 0 and os.getcwd() == here and res.json["setup"][0]["site"] == f"{script}:3"


def test_sys_exit_is_reported_with_its_status(tmp_path, run_cli):
    script = tmp_path / "leave.py"
    for code, rc in (("0", 0), ("3", 3), ("'no GPU found'", 1)):  # the script's own code
        script.write_text(f"import sys\nsys.exit({code})\n")
        res = run_cli("doctor", "--", script)
        assert res.rc == rc
        if rc:
            one_line_error(res, "exited with status", rc=rc)


@pytest.mark.slow  # a spawned worker imports torch and torchvision
def test_own_argparse_and_dataloader_workers_under_main_guard(tmp_path, run_cli):
    """A spawned worker re-imports the script (``__mp_main__``): the guard keeps it out."""
    script, where = write(tmp_path, "train.py", MNIST)
    res = run_cli("doctor", "--", script, "--no-such-flag")
    *script_says, last = res.err.strip().splitlines()  # the script's argparse, then doctor
    assert res.rc == 2 and "unrecognized arguments: --no-such-flag" in script_says[-1]
    assert last.startswith("latecast: error: ") and "exited with status 2" in last
    res = run_cli(
        "doctor", "--steps", "2", "--json", "--", script, "--workers", "1", "--batch-size", "16"
    )
    assert res.rc == 0, res.err
    assert sites(res.json, where)["float32"]["shape"] == [16, 1, 28, 28]


DDP = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(10):
    x = torch.randint(0, 200, (4, 8)).float().to("cpu")  # MOVE
    model(x).sum().backward()
    opt.step()
dist.destroy_process_group()
"""

ONE_RANK = "import builtins, sys, weakref\n" + DDP.replace(  # one rank, in this process
    '("gloo")', '("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)'
).replace("opt = ", "builtins.doctor_test_model = weakref.ref(model)  # gone after doctor?\nopt = ")


def test_a_script_stopped_at_steps_leaves_no_process_group_behind(tmp_path, run_cli):
    """Stopped before its ``destroy_process_group()``, the script's group and DDP model are
    freed by doctor: no gloo thread left at exit (the abort of pytorch/pytorch#179291)."""
    script, _ = write(tmp_path, "one_rank.py", ONE_RANK)
    try:
        res = run_cli("doctor", "--steps", "2", "--json", "--", script, tmp_path / "group")
        assert res.rc == 0 and res.json["ended"] == "steps", res.err
        assert not dist.is_initialized() and builtins.doctor_test_model() is None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        vars(builtins).pop("doctor_test_model", None)


@pytest.mark.slow  # torchrun and its two Python processes
def test_under_torchrun_rank_0_reports_and_torchrun_after_the_dashes_is_refused(tmp_path, run_cli):
    script, where = write(tmp_path, "ddp.py", DDP)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "latecast", "doctor", "--steps", "3", "--json", "--", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=os.environ)
    assert proc.returncode == 0, proc.stderr
    reports = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert len(reports) == 1 and reports[0]["steps"] == 3
    (moved,) = reports[0]["sites"]
    assert moved["site"] == where and moved["kind"] == "integers" and moved["factor"] == 4.0
    res = run_cli("doctor", "--", "torchrun", "--nproc_per_node=2", script)
    one_line_error(res, "start doctor under torchrun")


def test_profile_needs_cuda_and_a_bad_output_dir_is_refused_before_the_script_runs(
    tmp_path, run_cli, monkeypatch
):
    import torch

    script = tmp_path / "marker.py"
    script.write_text("open('ran', 'w').close()\n")
    (tmp_path / "file").write_text("")
    monkeypatch.chdir(tmp_path)
    if not torch.cuda.is_available():
        one_line_error(run_cli("doctor", "--profile", "--", script), "needs CUDA")
    else:  # the MNIST loop on the GPU: the copies' share of the profiled steps
        mnist, _ = write(tmp_path, "train.py", MNIST)
        p = run_cli("doctor", "--profile", "--steps", "6", "--json", "--", mnist).json["profile"]
        assert p["steps"] == 3 and p["memcpy_htod_ms"] > 0 and 0 < p["memcpy_share"] < 1
    bad = run_cli("doctor", "--output-dir", tmp_path / "file" / "out", "--", script)
    one_line_error(bad, "not a folder")
    assert not (tmp_path / "ran").exists()
    assert run_cli("doctor", "--help").rc == 0


# -- doctor says what is so (issue 36) -------------------------------------------------------

# the two conversions the words give: plain PyTorch (uint16 on the host, widened on the
# device), and a latecast.Mover
TOKENS_PLAIN = TOKENS_CAST.replace("astype(np.int32)", "astype(np.uint16)").replace(
    _CAST_MOVE,
    "    x, y = x.to(device, non_blocking=True).long(), y.to(device, non_blocking=True).long()\n",
)
TOKENS_MOVER = (
    TOKENS_CAST.replace("import torch\n", "import torch\n\nimport latecast\n")
    .replace(_CAST_MOVE, "    x, y = mover((x, y))\n")
    .replace("\n\ndef get_batch", "\nmover = latecast.Mover(device=device)\n\n\ndef get_batch")
)


def test_tokens_made_per_call_and_cast_in_the_move_get_the_mover_or_plain_pytorch(
    tmp_path, run_cli, monkeypatch
):
    """The dtype that crosses (int64 after a blocking ``.to(device, dtype)``, int32 after a
    non-blocking one); batches made per call get plain PyTorch and a Mover, never ``wrap``:
    applied, the run is the original's. Floats cast in the move get no Mover (kept floats)."""
    rng = np.random.default_rng(0)
    rng.integers(0, 50257, 2048, dtype=np.uint16).tofile(tmp_path / "train.bin")
    monkeypatch.chdir(tmp_path)
    _, where = write(tmp_path, "train.py", TOKENS_CAST)
    r = run_cli("doctor", "--steps", "3", "--json", "--", "python", "train.py").json
    move, late = (f"train.py:{line_of(TOKENS_CAST, m)}" for m in ("# MOVE", "# ASYNC"))
    assert [s["dtype"] for s in r["sites"] if s["site"] == move] == ["int64", "int64"]
    assert all(s["factor"] == 4.0 for s in r["sites"] if s["site"] == move)
    (async_,) = [s for s in r["sites"] if s["site"] == late]
    assert async_["dtype"] == "int32" and async_["factor"] == 2.0
    (floats,) = sites(r, f"train.py:{line_of(TOKENS_CAST, '# FLOATS')}").values()
    assert "cast to integers in the move" in floats["change"]  # no Mover: it keeps floats
    for s in r["sites"]:
        assert "wrap" not in s["change"] and "made per call" in s["change"], s["change"]
        assert "`x.to(device, non_blocking=True)" in s["change"]
        assert "through a `latecast.Mover`" in s["change"]
    advised = applied(TOKENS_CAST, r["edits"])
    assert "    x, y = mover((x, y))  # MOVE" in advised
    texts = {"advised.py": advised, "by_hand.py": TOKENS_MOVER, "plain.py": TOKENS_PLAIN}
    runs = run_each(tmp_path, {"train.py": TOKENS_CAST, **texts})
    assert runs[0].count("loss ") == 6 and runs.count(runs[0]) == 4
    again = run_cli("doctor", "--steps", "3", "--json", "--", "advised.py").json
    (packed,) = sites(again, f"advised.py:{line_of(advised, '# MOVE')}").values()
    assert packed["latecast"] and packed["dtype"] == "uint8"  # the Mover's one copy


# torchvision's segmentation reference in its shape: a VisionDataset given a joint
# `transforms=` preset (flip image and mask alike, then the image to normalized floats, the
# mask to int64 with 255 at the edges), one preset class for train and test, cross_entropy
# with ignore_index=255, the evaluation under no_grad after each epoch
SEGMENTATION = """
import argparse

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision import transforms
from torchvision.datasets import VisionDataset
from torchvision.transforms import functional as TF

import latecast


class Shapes(VisionDataset):
    def __init__(self, split, transforms=None, limit=64):
        super().__init__(".", transforms=transforms)
        ds = latecast.load_dataset("mnist", split)
        self.images, self.labels = ds.images[:limit, :, :, 0], ds.labels[:limit]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        pixels = self.images[i]
        mask = np.where(pixels > 128, self.labels[i] + 1, 0).astype(np.uint8)
        mask[(pixels > 64) & (pixels <= 128)] = 255
        image = Image.fromarray(np.stack([pixels, 255 - pixels, pixels // 2], -1))
        return self.transforms(image, Image.fromarray(mask))


class SegmentationPreset:
    def __init__(self, train, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
        self.train = train
        self.image = transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])

    def __call__(self, image, mask):
        if self.train and torch.rand(1) < 0.5:
            image, mask = TF.hflip(image), TF.hflip(mask)
        return self.image(image), torch.as_tensor(np.array(mask), dtype=torch.int64)


def evaluate(model, data_loader, device):
    model.eval()
    correct = 0
    with torch.no_grad():
        for image, target in data_loader:
            image, target = image.to(device), target.to(device)
            correct += (model(image).argmax(1) == target).sum().item()
    print(f"correct {correct}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    dataset = Shapes("train", transforms=SegmentationPreset(train=True))
    dataset_test = Shapes("test", transforms=SegmentationPreset(train=False))
    data_loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True, drop_last=True)
    data_loader_test = torch.utils.data.DataLoader(dataset_test, batch_size=8)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 11, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(2):
        model.train()
        for image, target in data_loader:
            image, target = image.to(device), target.to(device)  # MOVE
            loss = F.cross_entropy(model(image), target, ignore_index=255)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"loss {loss.item()!r}")
        evaluate(model, data_loader_test, device)
    print(f"weights {sum(p.double().sum() for p in model.parameters()).item()!r}")


if __name__ == "__main__":
    main()
"""

SEGMENTATION_BY_HAND = by_hand(
    SEGMENTATION,
    "transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])",
    "mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)",
    "data_loader",
    "data_loader_test",
)


def test_a_segmentation_presets_advice_keeps_mean_std_and_wraps_the_test_loader_too(
    tmp_path, run_cli
):
    """A joint (image, mask) ``transforms=`` preset: its Normalize is found through it, both
    loaders are wrapped with its mean/std (once only the train loader, without them: images
    silently unnormalized); applied, the run equals the hand conversion."""
    script, where = write(tmp_path, "seg.py", SEGMENTATION)
    r = run_cli("doctor", "--steps", "3", "--json", "--", script).json
    found = sites(r, where)
    assert found["float32"]["kind"] == "8-bit image" and found["int64"]["could_cross"] == "uint8"
    stats = "mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)"
    advised = applied(SEGMENTATION, r["edits"])
    assert "transforms.Compose([transforms.PILToTensor()])" in advised
    for loader in ("data_loader", "data_loader_test"):
        made = next(x for x in advised.splitlines() if x.startswith(f"    {loader} = "))
        assert made.startswith(f"    {loader} = latecast.wrap(") and made.endswith(f"{stats})")
    texts = {"seg.py": SEGMENTATION, "advised.py": advised, "by_hand.py": SEGMENTATION_BY_HAND}
    alone, advised, hand = run_each(tmp_path, texts)
    assert advised == hand and advised.count("correct ") == 2
    assert len(advised.split()) == len(alone.split())
    for a, b in zip(advised.split(), alone.split()):  # losses, correct pixels, weights
        assert a == b or abs(float(a) - float(b)) <= 1e-4 * abs(float(b)), (a, b)


def test_a_loader_whose_images_stay_float_is_not_wrapped_for_its_labels_alone(tmp_path, run_cli):
    """Images doctor cannot make uint8 (the script's own transform): no ``wrap`` written for
    the labels alone (without mean/std, images made uint8 by hand go unnormalized)."""
    own = SEGMENTATION.replace("transforms.ToTensor(), transforms.Normalize", "ToFloat(), Norm")
    own = own.replace(
        "class SegmentationPreset:",
        "ToFloat = lambda: transforms.Lambda(TF.to_tensor)\n"
        "Norm = transforms.Normalize\n\n\nclass SegmentationPreset:",
    )
    script, where = write(tmp_path, "own.py", own)
    r = run_cli("doctor", "--steps", "2", "--json", "--", script).json
    assert r["edits"] == [] and sites(r, where)["float32"]["kind"] == "8-bit image"
    assert "its images must become uint8 in the same change" in sites(r, where)["int64"]["change"]


# accelerate's cv_example in its shape: the prepared loader moves each batch to the device
# (device_placement), and the loop moves it again with .to(accelerator.device)
ACCELERATE_CV = """
import argparse
import os
import re

import numpy as np
import PIL.Image
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import Compose, RandomResizedCrop, Resize, ToTensor


def label_of(path):
    return re.search(r"^(.*)_\\d+\\.png$", os.path.basename(path)).groups()[0]


class Pets(Dataset):
    def __init__(self, paths, image_transform, label_to_id):
        self.paths, self.image_transform, self.label_to_id = paths, image_transform, label_to_id

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        image = self.image_transform(PIL.Image.open(self.paths[i]).convert("RGB"))
        return {"image": image, "label": self.label_to_id[label_of(self.paths[i])]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    accelerator = Accelerator(cpu=args.cpu)
    paths = sorted(os.path.join(args.data_dir, f) for f in os.listdir(args.data_dir))
    label_to_id = {x: i for i, x in enumerate(sorted({label_of(p) for p in paths}))}
    set_seed(42)
    order = np.random.permutation(len(paths))
    cut = int(0.8 * len(paths))
    train_tfm = Compose([RandomResizedCrop((32, 32), scale=(0.5, 1.0)), ToTensor()])
    eval_tfm = Compose([Resize((32, 32)), ToTensor()])
    train = Pets([paths[i] for i in order[:cut]], train_tfm, label_to_id)
    evals = Pets([paths[i] for i in order[cut:]], eval_tfm, label_to_id)
    train_dataloader = DataLoader(train, shuffle=True, batch_size=8)
    eval_dataloader = DataLoader(evals, shuffle=False, batch_size=8)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(4, len(label_to_id)))
    model = model.to(accelerator.device)
    mean = torch.tensor([0.485, 0.456, 0.406])[None, :, None, None].to(accelerator.device)
    std = torch.tensor([0.229, 0.224, 0.225])[None, :, None, None].to(accelerator.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader
    )
    for epoch in range(2):
        model.train()
        for step, batch in enumerate(train_dataloader):  # PREPARED
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}  # MOVE
            outputs = model((batch["image"] - mean) / std)
            loss = torch.nn.functional.cross_entropy(outputs, batch["label"])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()


if __name__ == "__main__":
    main()
"""


def test_a_batch_accelerate_moved_then_moved_again_by_the_script_crosses_once(tmp_path, run_cli):
    """The prepared loader's move is charged to the loop's line; the script's own ``.to`` of
    it is no row (once counted twice); ``image_transform`` cannot be converted: no edit."""
    pytest.importorskip("accelerate")
    from PIL import Image

    rng = np.random.default_rng(0)
    (tmp_path / "pets").mkdir()
    for name in ("cat", "dog"):
        for i in range(10):
            pixels = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "pets" / f"{name}_{i}.png")
    script, _ = write(tmp_path, "cv.py", ACCELERATE_CV, "# PREPARED")
    argv = ["--data_dir", tmp_path / "pets", "--cpu"]
    r = run_cli("doctor", "--steps", "3", "--json", "--", script, *argv).json
    prepared, moved = (f"{script}:{line_of(ACCELERATE_CV, m)}" for m in ("# PREPARED", "# MOVE"))
    assert {s["site"] for s in r["sites"]} == {prepared}
    assert r["total"]["bytes_per_step"] == 8 * 3 * 32 * 32 * 4 + 8 * 8
    assert not any(s["site"] == moved for s in r["sites"] + r["evaluation"])
    assert r["edits"] == []


EARLY = """import sys
import torch
x = torch.zeros(3).to("cpu")
model = torch.nn.Linear(4, 2).to("cpu")
if sys.argv[1:] == ["exit"]:
    sys.exit(3)
raise ValueError("no data")
"""


def test_a_script_that_dies_before_its_first_step_is_told_no_step_ran(tmp_path, run_cli):
    """Not "nothing to change": no step ran, its error and line said, the script's exit code;
    its one-time moves are listed apart, no per-step rows."""
    script, _ = write(tmp_path, "early.py", EARLY, None)
    res = run_cli("doctor", "--json", "--", script)
    line = one_line_error(res)
    assert "raised ValueError: no data" in line and f"{script}:7" in line
    assert "nothing to change" not in res.out and res.json["sites"] == []  # no per-step row
    assert {s["site"] for s in res.json["setup"]} == {f"{script}:3", f"{script}:4"}
    assert "bytes/step" not in res.out  # no per-step table: its moves are listed apart
    assert f"moved with no step run, not counted per step: {script}:3" in res.out
    assert f"no optimizer step ran: the script {res.json['error'].split(' ', 1)[1]}" in res.out
    assert res.json["steps"] == 0 and res.json["exit_status"] == 1 and res.json["exit_code"] == 1
    assert res.json["error"] == line.removeprefix("latecast: error: ")  # the --json contract
    res = run_cli("doctor", "--json", "--", script, "exit")
    one_line_error(res, "exited with status 3", rc=3)
    assert res.json["exit_code"] == 3
    assert "no optimizer step ran: the script exited with status 3" in res.out


SPEECH = """
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class SpeechCommands(Dataset):  # int16 PCM read as torchaudio.load hands it: float32 / 32768
    def __init__(self):
        rng = np.random.default_rng(0)
        self.clips = rng.integers(-32768, 32768, (32, 1, 16000), dtype=np.int16)

    def __len__(self):
        return len(self.clips)

    def __getitem__(self, i):
        return torch.from_numpy(self.clips[i].astype(np.float32) / 32768), i % 35


conv = torch.nn.Conv1d(1, 4, 80, 16)
model = torch.nn.Sequential(conv, torch.nn.Flatten(), torch.nn.LazyLinear(35))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for waveform, label in DataLoader(SpeechCommands(), batch_size=8, shuffle=True):
    waveform = waveform.to("cpu")  # MOVE
    loss = torch.nn.functional.cross_entropy(model(waveform), label.to("cpu"))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_float32_pcm16_audio_crosses_as_int16_through_waveform(tmp_path, run_cli):
    script, where = write(tmp_path, "speech.py", SPEECH)
    res = run_cli("doctor", "--steps", "3", "--json", "--", script)
    assert res.rc == 0, res.err
    audio = sites(res.json, where)["float32"]
    assert audio["shape"] == [8, 1, 16000] and audio["kind"] == "audio"
    assert audio["could_cross"] == "int16" and audio["factor"] == 2.0
    assert audio["bytes_per_step_then"] == 8 * 16000 * 2
    assert "latecast.waveform(16000)" in res.out and 'dtype="int16"' in res.out
    assert "PILToTensor" not in res.out and "doctor cannot write this change" in res.out


VIDEO = """
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

MEAN, STD = (0.43216, 0.394666, 0.37645), (0.22803, 0.22145, 0.216989)


class Clips(Dataset):  # decoded uint8 (T, H, W, C) frames, scaled and normalized per clip
    def __init__(self):
        self.frames = np.random.default_rng(0).integers(0, 256, (16, 8, 16, 16, 3), np.uint8)

    def __len__(self):
        return len(self.frames)

    def __getitem__(self, i):
        x = torch.from_numpy(self.frames[i]).float() / 255
        x = (x - torch.tensor(MEAN)) / torch.tensor(STD)
        return x.permute(3, 0, 1, 2), i % 4  # (C, T, H, W)


conv = torch.nn.Conv3d(3, 4, 3, 2)
model = torch.nn.Sequential(conv, torch.nn.Flatten(), torch.nn.LazyLinear(4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for clip, label in DataLoader(Clips(), batch_size=4, shuffle=True):
    clip = clip.to("cpu")  # MOVE
    loss = torch.nn.functional.cross_entropy(model(clip), label.to("cpu"))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_float32_normalized_video_clips_cross_as_uint8_through_clip(tmp_path, run_cli):
    script, where = write(tmp_path, "video.py", VIDEO)
    res = run_cli("doctor", "--steps", "3", "--json", "--", script)
    assert res.rc == 0, res.err
    clip = sites(res.json, where)["float32"]
    assert clip["shape"] == [4, 3, 8, 16, 16] and clip["kind"] == "video clips"
    assert clip["could_cross"] == "uint8" and clip["factor"] == 4.0
    assert np.allclose(clip["mean"], [0.43216, 0.394666, 0.37645], rtol=0, atol=1e-4)
    assert np.allclose(clip["std"], [0.22803, 0.22145, 0.216989], rtol=0, atol=1e-4)
    assert 'latecast.clip(8, "NCTHW")' in res.out and "PILToTensor" not in res.out


CT = """
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class CT(Dataset):  # int16 Hounsfield units, windowed to (-1000, 400) and mapped to [0, 1]
    def __init__(self):
        self.slices = np.random.default_rng(0).integers(-1024, 2000, (32, 1, 32, 32), np.int16)

    def __len__(self):
        return len(self.slices)

    def __getitem__(self, i):
        x = (np.clip(self.slices[i], -1000, 400).astype(np.float32) + 1000) / 1400
        return torch.from_numpy(x), i % 2


conv = torch.nn.Conv2d(1, 4, 3, 2)
model = torch.nn.Sequential(conv, torch.nn.Flatten(), torch.nn.LazyLinear(2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for image, label in DataLoader(CT(), batch_size=8, shuffle=True):
    image = image.to("cpu")  # MOVE
    loss = torch.nn.functional.cross_entropy(model(image), label.to("cpu"))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_windowed_ct_is_told_image16_with_its_window_not_piltotensor(tmp_path, run_cli):
    script, where = write(tmp_path, "ct.py", CT)
    res = run_cli("doctor", "--steps", "3", "--json", "--", script)
    assert res.rc == 0, res.err
    image = sites(res.json, where)["float32"]
    assert image["shape"] == [8, 1, 32, 32] and image["kind"] == "16-bit image"
    assert image["could_cross"] == "int16" and image["factor"] == 2.0
    assert "latecast.image16(window=(LOW, LOW + 1400))" in res.out
    assert "PILToTensor" not in res.out


RAY = """
import numpy as np
import ray
import torch

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
rng = np.random.default_rng(0)
ds = ray.data.from_items(
    [{"image": rng.integers(0, 256, (12, 10, 3), np.uint8), "label": i % 4} for i in range(32)]
)
mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
try:
    for batch in ds.iter_torch_batches(batch_size=8, dtypes=torch.float32):  # RAY
        x = (batch["image"].permute(0, 3, 1, 2) / 255 - mean) / std  # NCHW, normalized
        x, y = x.to("cpu"), batch["label"].long().to("cpu")  # MOVE
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
finally:
    ray.shutdown()
"""


@pytest.mark.slow  # Ray starts its own processes
def test_a_ray_data_loop_is_told_dtypes_none_and_wrap_with_the_image_field_not_piltotensor(
    tmp_path, run_cli
):
    """Ray Train's style: ``iter_torch_batches(dtypes=torch.float32)`` of a uint8 column,
    normalized on the host in the loop. doctor names the 8-bit images, their mean/std and
    the change docs/dataloader.md's Ray section gives; it advised ``PILToTensor()``."""
    pytest.importorskip("ray")
    script, where = write(tmp_path, "ray_loop.py", RAY)
    res = run_cli("doctor", "--steps", "3", "--json", "--", script)
    assert res.rc == 0, res.err
    image = sites(res.json, where)["float32"]
    assert image["shape"] == [8, 3, 12, 10] and image["kind"] == "8-bit image"
    assert np.allclose(image["mean"], [0.485, 0.456, 0.406], atol=1e-4)
    assert np.allclose(image["std"], [0.229, 0.224, 0.225], atol=1e-4)
    assert f"`iter_torch_batches` at {script}:{line_of(RAY, '# RAY')}" in image["change"]
    assert "dtypes=None" in res.out and 'fields={"image": "image"}' in res.out
    assert "PILToTensor" not in res.out and not res.json["edits"]


MONAI_BRAIN = """
import numpy as np
import torch
from monai.transforms import Compose, ScaleIntensityRanged
from torch.utils.data import DataLoader, Dataset


class Slices(Dataset):  # MONAI's dict samples: int16 Hounsfield units, a label
    def __init__(self, transform):
        rng = np.random.default_rng(0)
        images = rng.integers(-1024, 2000, (32, 1, 32, 32)).astype(np.int16)
        self.data = [{"image": x, "label": i % 2} for i, x in enumerate(images)]
        self.transform = transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.transform(dict(self.data[i]))


brain = ScaleIntensityRanged(["image"], a_min=0, a_max=80, b_min=0.0, b_max=1.0, clip=True)
conv = torch.nn.Conv2d(1, 4, 3, 2)
model = torch.nn.Sequential(conv, torch.nn.Flatten(), torch.nn.LazyLinear(2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for batch in DataLoader(Slices(Compose([brain])), batch_size=8, shuffle=True):
    image = batch["image"].to("cpu")  # MOVE
    loss = torch.nn.functional.cross_entropy(model(image), batch["label"].to("cpu"))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
CT_BRAIN = CT.replace("(-1000, 400)", "(0, 80)").replace(
    "(np.clip(self.slices[i], -1000, 400).astype(np.float32) + 1000) / 1400",
    "np.clip(self.slices[i], 0, 80).astype(np.float32) / 80",
)


@pytest.mark.parametrize(
    "text, told",
    [
        (MONAI_BRAIN, "fields={'image': latecast.image16(window=(0, 80))}"),
        (CT_BRAIN, "latecast.image16(window=(LOW, LOW + 80))"),
    ],
)
def test_a_ct_windowed_narrower_than_256_units_is_told_image16_not_piltotensor(
    tmp_path, run_cli, text, told
):
    """A brain window (0, 80 HU) leaves 81 levels, an 8-bit grid: it was told
    ``PILToTensor()``. The 16-bit source tells it apart: MONAI's ``ScaleIntensityRanged``
    (its window, in stored units) or the dataset's int16 array."""
    pytest.importorskip("monai")
    assert "a_max=80" in text or "clip(self.slices[i], 0, 80)" in text  # the replace took
    script, where = write(tmp_path, "brain.py", text)
    res = run_cli("doctor", "--steps", "3", "--json", "--", script)
    assert res.rc == 0, res.err
    image = sites(res.json, where)["float32"]
    assert image["shape"] == [8, 1, 32, 32] and image["kind"] == "16-bit image"
    assert image["could_cross"] == "int16" and image["factor"] == 2.0
    assert told in res.out and "PILToTensor" not in res.out and not res.json["edits"]
