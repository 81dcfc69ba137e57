"""Not only images: nanoGPT-style training batches through `latecast.wrap`.

nanoGPT reads uint16 token ids from a memmap and widens them to int64 on the host before
the copy: 8 bytes per token cross the bus. Wrapped, they cross as the 2 bytes they are
and become int64 on the device.

python examples/nanogpt_tokens.py [--data train.bin] [--steps 200]
(without --data it writes 100,000 random GPT-2 token ids to a temporary train.bin)
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import latecast

VOCAB = 50304  # GPT-2's 50257 tokens, padded as nanoGPT does: ids need uint16


def get_batch(data: np.memmap, batch: int, block: int, rng: np.random.Generator):
    """nanoGPT's get_batch up to its move: int64 (batch, block) arrays of uint16 token ids."""
    starts = rng.integers(0, len(data) - block - 1, batch)
    x = np.stack([data[s : s + block].astype(np.int64) for s in starts])
    y = np.stack([data[s + 1 : s + 1 + block].astype(np.int64) for s in starts])
    return x, y


args = argparse.ArgumentParser()
args.add_argument("--data", help="uint16 token file (nanoGPT's train.bin)")
args.add_argument("--steps", type=int, default=200)
args = args.parse_args()
if args.data is None:
    args.data = Path(tempfile.mkdtemp()) / "train.bin"
    np.random.default_rng(0).integers(0, 50257, 100_000).astype(np.uint16).tofile(args.data)
data = np.memmap(args.data, dtype=np.uint16, mode="r")

rng = np.random.default_rng(0)
batches = (get_batch(data, 4, 32, rng) for _ in range(args.steps))
loader = latecast.wrap(batches, fields={0: torch.uint16, 1: torch.uint16})  # x, y: 2 bytes
model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))
model = model.to(loader.device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for x, y in loader:  # int64 (4, 32) on the device
    loss = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()

s, tokens = loader.stats, args.steps * 2 * 4 * 32
assert s.h2d_bytes == 2 * tokens and s.usual_bytes == 8 * tokens, s
print(f"loss {loss.item():.3f}; {tokens:,} tokens crossed in {s.h2d_bytes:,} bytes:")
print(f"2 bytes per token, where 8 as int64 would be {s.usual_bytes:,} ({s.copies} copies)")
