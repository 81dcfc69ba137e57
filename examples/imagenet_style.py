"""The shape of pytorch/examples' ImageNet script, through latecast.wrap: ImageFolder train and
val loaders with DistributedSampler under torchrun, and the script's second validation
loader, made from `val_loader.dataset`, for the samples a drop_last DistributedSampler leaves
out. That second loader is wrapped too, with the first one's `mean`/`std`: it yields what the
dataset yields (uint8), and unwrapped it would fail ("expected scalar type Byte").

torchrun --standalone --nproc_per_node=2 examples/imagenet_style.py   # CPU: gloo
python examples/imagenet_style.py --folder DIR   # DIR/train/<class>/*.png and DIR/val/...
(without --folder each process writes MNIST digits as PNGs to its own temporary folder)
"""

import argparse
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, DistributedSampler, Subset
from torchvision import datasets, transforms

import latecast

MEAN, STD = (0.1307,), (0.3081,)  # MNIST's


def write_folder(root: Path, split: str, source: str, n: int) -> None:
    ds = latecast.load_dataset("mnist", source)
    for i in range(n):
        out = root / split / str(ds.labels[i])
        out.mkdir(parents=True, exist_ok=True)
        Image.fromarray(ds.images[i, :, :, 0]).save(out / f"{i}.png")


def validate(model, val_loader, world: int) -> tuple[int, int, int]:
    """(correct, total, rest) over the whole val set: this rank's share summed over ranks,
    then the rest, which every rank validates from a loader made from `val_loader.dataset`."""
    counts = torch.zeros(2, dtype=torch.int64)
    with torch.no_grad():
        for images, labels in val_loader:
            counts += torch.tensor([(model(images).argmax(1) == labels).sum(), len(labels)])
        if world > 1:
            dist.all_reduce(counts)
        done = len(val_loader.sampler) * world
        if done < len(val_loader.dataset):  # the ImageNet script's aux_val_loader
            rest = Subset(val_loader.dataset, range(done, len(val_loader.dataset)))
            aux = latecast.wrap(DataLoader(rest, 64), mean=val_loader.mean, std=val_loader.std)
            for images, labels in aux:
                counts += torch.tensor([(model(images).argmax(1) == labels).sum(), len(labels)])
    return int(counts[0]), int(counts[1]), len(val_loader.dataset) - done


if __name__ == "__main__":
    args = argparse.ArgumentParser()
    args.add_argument("--folder", type=Path)
    args.add_argument("--limit", type=int, default=4000, help="digits written without --folder")
    args.add_argument("--epochs", type=int, default=2)
    args = args.parse_args()
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if args.folder is None:
        args.folder = Path(tempfile.mkdtemp())
        write_folder(args.folder, "train", "train", args.limit)
        write_folder(args.folder, "val", "test", 2 * (args.limit // 8) + 1)  # odd: 1 left out

    tf = transforms.Compose([transforms.Grayscale(), transforms.PILToTensor()])  # uint8
    train_set = datasets.ImageFolder(args.folder / "train", tf)
    val_set = datasets.ImageFolder(args.folder / "val", tf)
    train_sampler = DistributedSampler(train_set) if world > 1 else None
    val_sampler = DistributedSampler(val_set, shuffle=False, drop_last=True) if world > 1 else None
    train_loader = latecast.wrap(
        DataLoader(train_set, 128, shuffle=train_sampler is None, sampler=train_sampler),
        mean=MEAN,
        std=STD,
    )
    val_loader = latecast.wrap(DataLoader(val_set, 128, sampler=val_sampler), mean=MEAN, std=STD)

    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    ).to(train_loader.device)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(args.epochs):
        train_loader.set_epoch(epoch)  # reaches the DistributedSampler
        for images, labels in train_loader:
            loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        correct, total, rest = validate(model, val_loader, world)
        rank = dist.get_rank() if world > 1 else 0
        print(f"rank {rank} epoch {epoch}: validated {total} of {len(val_set)}, {rest} re-made")
    if world > 1:
        # DDP holds the gloo group: dropped here, so its worker threads end while Python
        # still runs. Left to exit, one of them may free its last all-reduce's tensors
        # during shutdown and abort the process (pytorch/pytorch#179291).
        del model
        dist.destroy_process_group()
