"""latecast with Lightning Fabric (needs `pip install lightning`), in the shape of Lightning's
examples/fabric/image_classifier/train_fabric.py: train, then evaluate on every test sample.

`fabric.setup_dataloaders` re-makes each DataLoader with a DistributedSampler and returns its
own wrapper, which moves batches to `fabric.device` and shows only the DataLoader's
attributes (wrapped first, latecast's `stats` are hidden behind it). So set the loaders up
first, without Fabric's moving, and wrap what it returns: each rank gets its own share,
latecast moves and prepares it, and `train.stats` says what crossed.

python examples/fabric_loop.py                                      # MNIST, 1 process
python examples/fabric_loop.py --devices 2 --limit 512 --epochs 1   # 2 processes (DDP)
"""

import argparse
import gc

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import latecast

args = argparse.ArgumentParser()
args.add_argument("--devices", type=int, default=1)
args.add_argument("--epochs", type=int, default=2)
args.add_argument("--limit", type=int, default=None, help="the first N train and test images")
args = args.parse_args()

fabric = L.Fabric(devices=args.devices, strategy="ddp" if args.devices > 1 else "auto")
fabric.launch()  # with 2 devices: this script again, in a second process
mnist = latecast.load_dataset("mnist")  # uint8 (N, 28, 28, 1), uint8 labels


def uint8_loader(split: str, **kwargs) -> DataLoader:
    """A DataLoader of uint8 (N, 1, 28, 28) images, as `PILToTensor()` gives them."""
    ds = latecast.load_dataset("mnist", split=split)
    images = torch.tensor(ds.images[: args.limit]).permute(0, 3, 1, 2)  # copied from the memmap
    labels = torch.tensor(ds.labels[: args.limit])
    return DataLoader(TensorDataset(images, labels), batch_size=256, **kwargs)


dl, test_dl = uint8_loader("train", shuffle=True), uint8_loader("test")
# --8<-- [start:wrap]
dl, test_dl = fabric.setup_dataloaders(dl, test_dl, move_to_device=False)  # sharded, not moved
train = latecast.wrap(dl, mean=mnist.mean, std=mnist.std)  # its stats stay reachable
# --8<-- [end:wrap]
test = latecast.wrap(test_dl, mean=mnist.mean, std=mnist.std)
model = torch.nn.Sequential(
    torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
)
model, opt = fabric.setup(model, torch.optim.Adam(model.parameters(), lr=1e-3))

for epoch in range(args.epochs):
    model.train()
    for images, labels in train:  # float (N, 1, 28, 28) normalized on the device, int64
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad()
        fabric.backward(loss)
        opt.step()
    model.eval()
    counts = torch.zeros(2, dtype=torch.int64, device=fabric.device)  # correct, seen
    with torch.no_grad():
        for images, labels in test:
            counts += torch.stack(
                [(model(images).argmax(1) == labels).sum(), labels.new_tensor(len(labels))]
            )
    correct, seen = fabric.all_reduce(counts, reduce_op="sum").tolist()
    fabric.print(f"epoch {epoch}: test accuracy {correct / seen:.4f} over {seen} samples")
assert train.stats.batches == args.epochs * len(train)  # this rank's share, every epoch
print(f"rank {fabric.global_rank} of {fabric.world_size}: {len(train)} batches, {train.stats}")

# The DDP model holds the process group: freed with it while Python runs. Left to Python's
# exit, torch's gloo group can abort the process now and then ("terminate called without an
# active exception", pytorch/pytorch#179291).
del model, opt
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
gc.collect()
