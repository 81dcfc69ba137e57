"""The Loader in five lines: the bundled MNIST, uint8 across the bus, normalized on the
device (the GPU when there is one, else the CPU), a linear model trained for one epoch.

python examples/quickstart.py   # raises if the model does not reach --min-accuracy
"""

import argparse

import torch
import torch.nn.functional as F

import latecast

args = argparse.ArgumentParser()
args.add_argument("--min-accuracy", type=float, default=0.88)
args = args.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"  # where the Loader's "auto" puts it
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def step(images: torch.Tensor, labels: torch.Tensor) -> None:
    loss = F.cross_entropy(model(images), labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


# --8<-- [start:loader]
train = latecast.load_dataset("mnist", split="train")  # uint8 (60000, 28, 28, 1), uint8 labels
loader = latecast.Loader(train, batch_size=256, shuffle=True, seed=0)  # on the GPU if any
for images, labels in loader:  # float32 (256, 1, 28, 28) normalized on the device; int64
    step(images, labels)
print(loader.stats)  # bytes host->device (and what float32 would have moved), batches, waits
# --8<-- [end:loader]

test = latecast.load_dataset("mnist", split="test")
test = latecast.Loader(test, batch_size=1000, device=device, shuffle=False, pad=False)
with torch.no_grad():
    correct = sum((model(x).argmax(1) == y).sum().item() for x, y in test)
accuracy = correct / len(test.dataset)
print(f"test accuracy {accuracy:.4f}")
if accuracy < args.min_accuracy:
    raise SystemExit(f"expected >= {args.min_accuracy:.0%} test accuracy, got {accuracy:.2%}")
