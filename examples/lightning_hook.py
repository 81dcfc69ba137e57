"""latecast with PyTorch Lightning (needs `pip install lightning`), both ways.

1. Your DataLoader yields uint8 (here a TensorDataset; `PILToTensor()` for image files):
   Lightning moves it, and the `PrepareOnDevice` mixin augments and normalizes it on the
   device in `on_after_batch_transfer`.
2. latecast's Loader is the train dataloader: its batches come out prepared on the device,
   each DDP process takes its own share (rank and device are read at the first batch,
   inside `fit`) and Lightning's checkpoints save its position.

python examples/lightning_hook.py                      # MNIST, 1 device, 2 epochs each way
python examples/lightning_hook.py --devices 2 --limit 512 --epochs 1   # 2 processes (DDP)
"""

import argparse

import lightning as L
import torch
import torch.nn.functional as F

import latecast
from latecast import PrepareOnDevice


# --8<-- [start:module]
class Classifier(PrepareOnDevice, L.LightningModule):
    def __init__(self, mean=None, std=None):
        super().__init__()  # no mean/std: batches that come prepared pass through untouched
        self.prepare_on_device(mean=mean, std=std, augment=latecast.Augment(crop=2))
        # --8<-- [end:module]
        self.net = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        )

    def training_step(self, batch, batch_idx):
        images, labels = batch  # float (N, 1, 28, 28) normalized on the device, int64 labels
        loss = F.cross_entropy(self.net(images), labels)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    args = argparse.ArgumentParser()
    args.add_argument("--devices", type=int, default=1)
    args.add_argument("--epochs", type=int, default=2)
    args.add_argument("--limit", type=int, default=None, help="train on the first N images")
    args = args.parse_args()
    train = latecast.load_dataset("mnist")
    images, labels = train.images[: args.limit], train.labels[: args.limit]

    def trainer():
        return L.Trainer(max_epochs=args.epochs, devices=args.devices, enable_progress_bar=False)

    # --8<-- [start:fit]
    # Way 1: your DataLoader, uint8 across the bus; Lightning adds the DistributedSampler.
    uint8_set = torch.utils.data.TensorDataset(torch.tensor(images), torch.tensor(labels))
    dl = torch.utils.data.DataLoader(uint8_set, batch_size=256, shuffle=True, pin_memory=True)
    trainer().fit(Classifier(train.mean, train.std), train_dataloaders=dl)

    # Way 2: the Loader as the dataloader, built before any DDP process exists.
    loader = latecast.Loader(latecast.from_arrays(images, labels), batch_size=256)
    trainer().fit(Classifier(), train_dataloaders=loader)
    # --8<-- [end:fit]
    print(f"rank {loader.rank} of {loader.world_size}: {len(loader)} batches, {loader.stats}")
