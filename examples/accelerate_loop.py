"""latecast with Hugging Face accelerate (needs `pip install accelerate`).

`Accelerator.prepare` passes non-DataLoader iterables through untouched; the Loader finds
its own rank, share and device at its first batch (from the process group accelerate
starts), and `register_for_checkpointing` puts its position in every `save_state`.

accelerate launch examples/accelerate_loop.py            # as `accelerate config` set it up
# 2 processes on the CPU (gloo; `--cpu` alone would start one):
ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 \
    examples/accelerate_loop.py --limit 512 --epochs 1
"""

import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator

import latecast

args = argparse.ArgumentParser()
args.add_argument("--epochs", type=int, default=2)
args.add_argument("--limit", type=int, default=None, help="train on the first N images")
args.add_argument("--state", default="runs/accelerate-state", help="save_state folder")
args = args.parse_args()

# --8<-- [start:loader]
accelerator = Accelerator()
mnist = latecast.load_dataset("mnist")
train = latecast.from_arrays(mnist.images[: args.limit], mnist.labels[: args.limit])
loader = latecast.Loader(train, batch_size=256, device=accelerator.device, seed=0)
model = torch.nn.Sequential(
    torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
model, opt = accelerator.prepare(model, opt)  # the loader stays as it is
accelerator.register_for_checkpointing(loader)  # its epoch and position go in save_state
# --8<-- [end:loader]

for epoch in range(loader.epoch, args.epochs):
    for images, labels in loader:  # this rank's share, normalized on accelerator.device
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
    accelerator.save_state(args.state)  # accelerator.load_state(args.state) resumes here
    accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
print(f"rank {loader.rank} of {loader.world_size}: {len(loader)} batches, {loader.stats}")
accelerator.end_training()  # the process group down before the process exits
