"""latecast with Hugging Face accelerate (needs `pip install accelerate`).

`Accelerator.prepare` passes non-DataLoader iterables through untouched, so the Loader is
built from the accelerator's own process index, process count and device.
Run: accelerate launch examples/accelerate_loop.py
"""

import torch
import torch.nn.functional as F
from accelerate import Accelerator

import latecast

accelerator = Accelerator()
train = latecast.load_dataset("mnist")
loader = latecast.Loader(
    train,
    batch_size=256,
    device=accelerator.device,
    seed=0,
    rank=accelerator.process_index,
    world_size=accelerator.num_processes,
)
model = torch.nn.Sequential(
    torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
model, opt = accelerator.prepare(model, opt)  # the loader stays as it is

for epoch in range(2):
    loader.set_epoch(epoch)
    for images, labels in loader:
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
    accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}, {loader.stats}")
