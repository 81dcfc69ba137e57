"""Not only images: nanoGPT-style batches through `latecast.Mover`, a two-line change.

nanoGPT's train.py builds every batch per call: random window starts from the global RNG,
int64 windows of a uint16 token memmap, then `x.pin_memory().to(device, non_blocking=True)`
for x and y: 8 bytes per token cross the bus. With a mover made once (line 1) and the move
replaced by it (line 2), the same tokens cross as the 2 bytes they are (they all fit
uint16) and are int64 on the device. The mover moves one batch when called, no read-ahead,
so the global RNG draws exactly what it drew before: same seed, same run.

python examples/nanogpt_tokens.py [--data-dir DIR] [--steps 200]
(without --data-dir it writes random GPT-2 token ids to a temporary train.bin and val.bin)
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import latecast

VOCAB = 50304  # GPT-2's 50257 tokens, padded as nanoGPT does: ids need uint16
BATCH, BLOCK = 4, 32


def token_windows(data_dir: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch as nanoGPT draws it: BATCH random windows of BLOCK tokens and the next ones."""
    data = np.memmap(data_dir / f"{split}.bin", dtype=np.uint16, mode="r")
    starts = torch.randint(len(data) - BLOCK, (BATCH,))  # the global RNG, as nanoGPT's
    x = torch.stack([torch.from_numpy(data[s : s + BLOCK].astype(np.int64)) for s in starts])
    y = torch.stack(
        [torch.from_numpy(data[s + 1 : s + 1 + BLOCK].astype(np.int64)) for s in starts]
    )
    return x, y


def usual_batch(data_dir: Path, split: str, device: torch.device):
    """The move as nanoGPT makes it: int64, 8 bytes a token."""
    x, y = token_windows(data_dir, split)
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


# --8<-- [start:mover]
mover = latecast.Mover(device="auto")  # line 1 of 2: made once, beside the model


def get_batch(data_dir: Path, split: str):
    x, y = token_windows(data_dir, split)
    return mover((x, y))  # line 2 of 2: was the pin_memory().to(device) of x and y


# --8<-- [end:mover]


def write_tokens(data_dir: Path) -> None:
    rng = np.random.default_rng(0)
    for split, n in (("train", 100_000), ("val", 10_000)):
        rng.integers(0, 50257, n).astype(np.uint16).tofile(data_dir / f"{split}.bin")


if __name__ == "__main__":
    args = argparse.ArgumentParser()
    args.add_argument("--data-dir", type=Path, help="nanoGPT's folder of train.bin, val.bin")
    args.add_argument("--steps", type=int, default=200)
    args = args.parse_args()
    if args.data_dir is None:
        args.data_dir = Path(tempfile.mkdtemp())
        write_tokens(args.data_dir)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Dropout(0.1))
    model = torch.nn.Sequential(model, torch.nn.Linear(32, VOCAB)).to(mover.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(args.steps):
        x, y = get_batch(args.data_dir, "train")  # int64 (4, 32) on the device
        loss = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0:
            with torch.no_grad():
                x, y = get_batch(args.data_dir, "val")  # one RNG, both splits, as nanoGPT
                val = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))

    s, tokens = mover.stats, mover.stats.batches * 2 * BATCH * BLOCK
    assert s.h2d_bytes == 2 * tokens and s.usual_bytes == 8 * tokens, s
    print(f"loss {loss.item():.3f}, val {val.item():.3f}; {tokens:,} tokens crossed in")
    print(f"{s.h2d_bytes:,} bytes: 2 bytes per token, where 8 as int64 would be {s.usual_bytes:,}")
