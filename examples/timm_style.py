"""timm's prefetch loader replaced by latecast.wrap, in the shape of timm's train.py loop.

timm's `create_loader(..., use_prefetcher=True)` moves uint8 batches, then on the device
normalizes them, casts them to the model's dtype (`--model-dtype`), makes them channels-last
(`--channels-last`) and erases boxes (`--reprob`, `--remode pixel`). Through wrap the
DataLoader yields uint8 and wrap does the rest: `dtype=` is the model's, `erase=` is
`latecast.Erasing`. timm's loader already moved uint8, so what shrinks is the labels (int64
-> uint8): the stats say so, `usual_bytes` being what the batches cost as they arrive.

python examples/timm_style.py [--model-dtype bfloat16] [--reprob 0.25] [--steps 20]
"""

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import latecast

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # timm's IMAGENET_DEFAULT_*

args = argparse.ArgumentParser()
args.add_argument("--model-dtype", default="bfloat16", choices=["float32", "bfloat16"])
args.add_argument("--reprob", type=float, default=0.25)
args.add_argument("--channels-last", action="store_true")
args.add_argument("--steps", type=int, default=20)
args = args.parse_args()
model_dtype = getattr(torch, args.model_dtype)

rng = np.random.default_rng(0)  # uint8 (C, H, W) images, as timm's transforms leave them
images = torch.from_numpy(rng.integers(0, 256, (64 * 4, 3, 32, 32), dtype=np.uint8))
data = TensorDataset(images, torch.from_numpy(rng.integers(0, 10, len(images))))
# --8<-- [start:wrap]
loader = latecast.wrap(
    DataLoader(data, batch_size=64, shuffle=True, drop_last=True),
    mean=MEAN,
    std=STD,
    dtype=model_dtype,  # the model's dtype, as timm's loader casts to it
    channels_last=args.channels_last,
    erase=latecast.Erasing(p=args.reprob, value="random") if args.reprob else None,
)
# --8<-- [end:wrap]
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, padding=1),
    torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1),
    torch.nn.Flatten(),
    torch.nn.Linear(16, 10),
).to(loader.device, model_dtype)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
step = 0
while step < args.steps:
    for x, y in loader:  # model_dtype (64, 3, 32, 32), normalized and erased on the device
        assert x.dtype == model_dtype
        loss = F.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
s = loader.stats
print(f"loss {loss.item():.3f}; {s.h2d_bytes:,} bytes crossed where timm's loader moved")
print(f"{s.usual_bytes:,} ({1 - s.h2d_bytes / s.usual_bytes:.2%} fewer: the labels)")
