"""latecast with PyTorch Lightning, both ways (needs `pip install lightning`).

1. latecast's Loader *is* the train dataloader: Lightning iterates custom iterables as
   they are (it injects no sampler), the batches arrive already on the device and
   normalized. Under DDP the Loader reads RANK/WORLD_SIZE itself.
2. Keep your DataLoader but let it yield uint8: the device-side work goes in
   `on_after_batch_transfer`, Lightning's official place for it.
"""

import lightning as L
import torch
import torch.nn.functional as F

import latecast


class Classifier(L.LightningModule):
    def __init__(self, mean, std, augment=None):
        super().__init__()
        self.mean, self.std, self.augment = mean, std, augment
        self.net = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        )

    def on_after_batch_transfer(self, batch, dataloader_idx):
        images, labels = batch
        if images.dtype == torch.uint8:  # way 2: uint8 (N, H, W, C) crossed the bus
            if self.augment is not None and self.training:
                images = self.augment(images)
            images = latecast.normalize(images, self.mean, self.std)
        return images, labels.long()

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self.net(images), labels)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    train = latecast.load_dataset("mnist")
    model = Classifier(train.mean, train.std)
    trainer = L.Trainer(max_epochs=1, accelerator="auto", devices=1)
    # Way 1: the Loader as the dataloader (device must match the trainer's).
    loader = latecast.Loader(train, 256, device="cuda" if torch.cuda.is_available() else "cpu")
    trainer.fit(model, train_dataloaders=loader)
    # Way 2: an ordinary DataLoader over uint8 tensors; the module normalizes on the device.
    uint8_set = torch.utils.data.TensorDataset(
        torch.from_numpy(train.images.copy()), torch.from_numpy(train.labels.copy())
    )
    dl = torch.utils.data.DataLoader(uint8_set, batch_size=256, shuffle=True, pin_memory=True)
    L.Trainer(max_epochs=1, accelerator="auto", devices=1).fit(model, train_dataloaders=dl)
