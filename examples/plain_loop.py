"""Your own data in a plain PyTorch loop: a torchvision ImageFolder whose DataLoader yields
uint8 (`PILToTensor()` instead of `ToTensor()`), wrapped by latecast. uint8 crosses the
bus; the normalize happens on the device and equals `ToTensor()` + `Normalize()`. With
--jpeg, the fast way: the training files cross as they are (`latecast.jpeg_folder`), and
wrap decodes them where the pixels are used.

python examples/plain_loop.py --folder DIR   # DIR/train/<class>/*.png and DIR/test/...
python examples/plain_loop.py [--jpeg]       # writes 12,000 MNIST digits as PNGs (JPEGs) first
(raises if the model does not reach --min-accuracy on the test folder)
"""

import argparse
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

import latecast

MEAN, STD = (0.1307,), (0.3081,)  # MNIST's


def write_folder(root: Path, split: str, n: int, suffix: str) -> None:
    """The first n MNIST digits of `split` as root/split/<digit>/<i>.png (or .jpg)."""
    ds = latecast.load_dataset("mnist", split)
    for i in range(n):
        out = root / split / str(ds.labels[i])
        out.mkdir(parents=True, exist_ok=True)
        Image.fromarray(ds.images[i, :, :, 0]).save(out / f"{i}.{suffix}", quality=95)


args = argparse.ArgumentParser()
args.add_argument("--folder", type=Path)
args.add_argument("--limit", type=int, default=12_000, help="digits written without --folder")
args.add_argument("--epochs", type=int, default=3)
args.add_argument("--min-accuracy", type=float, default=0.9)
args.add_argument("--jpeg", action="store_true", help="train from the JPEG files' bytes")
args = args.parse_args()
if args.folder is None:
    args.folder = Path(tempfile.mkdtemp())
    write_folder(args.folder, "train", args.limit, "jpg" if args.jpeg else "png")
    write_folder(args.folder, "test", args.limit // 5, "jpg" if args.jpeg else "png")


# --8<-- [start:wrap]
# was: Compose([Grayscale(), ToTensor(), Normalize(MEAN, STD)]), and train = dl
tf = transforms.Compose([transforms.Grayscale(), transforms.PILToTensor()])  # uint8 (1, H, W)
dl = DataLoader(datasets.ImageFolder(args.folder / "train", tf), 256, shuffle=True, num_workers=2)
train = latecast.wrap(dl, mean=MEAN, std=STD)  # the normalize, on the device
# --8<-- [end:wrap]
if args.jpeg:  # the fast way: the files' bytes cross, decoded (1 channel, 28x28) by wrap
    # --8<-- [start:jpeg]
    files = latecast.jpeg_folder(args.folder / "train")  # workers forked once, for every epoch
    dl = DataLoader(files, 256, shuffle=True, num_workers=2, persistent_workers=True)
    train = latecast.wrap(dl, mean=MEAN, std=STD, fields={0: latecast.jpeg(28, channels=1)})
    # --8<-- [end:jpeg]
test = latecast.wrap(
    DataLoader(datasets.ImageFolder(args.folder / "test", tf), 1000), mean=MEAN, std=STD
)
model = torch.nn.Sequential(
    torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
).to(train.device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)

for _ in range(args.epochs):
    # --8<-- [start:loop]
    for images, labels in train:  # float32 (N, 1, 28, 28) normalized on the device, int64
        loss = F.cross_entropy(model(images), labels)
        # --8<-- [end:loop]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

correct = total = 0
with torch.no_grad():
    for images, labels in test:
        correct += (model(images).argmax(1) == labels).sum().item()
        total += len(labels)
print(f"test accuracy {correct / total:.4f}; {train.stats}")
if correct / total < args.min_accuracy:
    raise SystemExit(
        f"expected >= {args.min_accuracy:.0%} test accuracy, got {correct / total:.2%}"
    )
