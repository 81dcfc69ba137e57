"""CT segmentation, MONAI's shape: int16 slices in Hounsfield units beside their label maps.

The usual pipeline windows each slice on the host (`ScaleIntensityRange(-1000, 400, 0, 1,
clip=True)`) and moves float32, 4 bytes a pixel. Declared `latecast.image16(window=...)`, the
slices cross as the int16 they are stored in, 2 bytes a pixel, and are windowed on the device;
the masks (declared "mask") move with them through the crop and flip.

python examples/ct_segmentation.py [--slices 32] [--epochs 2]
(synthetic slices: air, a body of soft tissue, a bone inside it; classes 0, 1, 2)
"""

import argparse
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import latecast

SIZE = 64  # pixels a side


class Slices(Dataset):
    """``{"image": int16 (1, H, W) HU, "mask": int64 (H, W)}``, as a NIfTI reader gives them."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        y, x = np.mgrid[:SIZE, :SIZE] / SIZE
        self.images, self.masks = [], []
        for _ in range(n):
            cy, cx, r = rng.uniform(0.35, 0.65, 2).tolist() + [rng.uniform(0.1, 0.2)]
            body = ((y - cy) / 0.4) ** 2 + ((x - cx) / 0.3) ** 2 < 1
            bone = (y - cy) ** 2 + (x - cx) ** 2 < r**2
            mask = body.astype(np.int64) + bone  # 0 air, 1 soft tissue, 2 bone
            hu = np.choose(mask, [-1000, 40, 1000]) + rng.normal(0, 30, mask.shape)
            self.images.append(hu.astype(np.int16)[None])
            self.masks.append(mask)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict:
        return {"image": torch.from_numpy(self.images[i]), "mask": torch.from_numpy(self.masks[i])}


args = argparse.ArgumentParser()
args.add_argument("--slices", type=int, default=32)
args.add_argument("--epochs", type=int, default=2)
args = args.parse_args()
torch.manual_seed(0)

# --8<-- [start:wrap]
dl = DataLoader(Slices(args.slices), batch_size=8, shuffle=True)  # int16 HU, int64 masks
train = latecast.wrap(
    dl,
    fields={"image": latecast.image16(window=(-1000, 400)), "mask": "mask"},
    augment=latecast.Augment(crop=8, flip=0.5),  # one draw moves the slice and its mask
)
# --8<-- [end:wrap]
model = torch.nn.Sequential(  # a tiny segmenter: 3 logits a pixel
    torch.nn.Conv2d(1, 16, 3, padding=1),
    torch.nn.ReLU(),
    torch.nn.Conv2d(16, 16, 3, padding=1),
    torch.nn.ReLU(),
    torch.nn.Conv2d(16, 3, 1),
).to(train.device)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
losses, pixels = [], 0
for _ in range(args.epochs):
    for batch in train:  # image: float32 (N, 1, H, W) in [0, 1]; mask: int64 (N, H, W)
        loss = F.cross_entropy(model(batch["image"]), batch["mask"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        pixels += batch["image"].numel()
assert all(map(math.isfinite, losses)), losses
s = train.stats
print(
    f"{len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; {s.image_bytes:,} image "
    f"bytes crossed as int16, {4 * pixels:,} as float32 ({4 * pixels / s.image_bytes:.2f}x); {s}"
)
