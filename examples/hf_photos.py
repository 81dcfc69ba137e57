"""A Hugging Face `datasets.Dataset` of photos, its JPEG files decoded on the device.

With `Image(decode=False)` each row's image is `{"bytes": ..., "path": ...}`: the DataLoader
workers hand the files on as they are, and `latecast.wrap` sends them across and decodes,
crops and normalizes them on the device (no PIL, no ToTensor in the workers).

python examples/hf_photos.py --parquet FILE     # a parquet file with "image" and "label"
                                                # columns (e.g. Dataset.to_parquet's); no hub
"""

import argparse
from pathlib import Path

import datasets
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import latecast

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)

args = argparse.ArgumentParser()
args.add_argument("--parquet", type=Path, required=True)
args.add_argument("--size", type=int, default=32, help="training size")
args.add_argument("--batch-size", type=int, default=32)
args.add_argument("--epochs", type=int, default=1)
args = args.parse_args()


def files(rows: list[dict]):  # the batch as it is: a list of {"bytes", "path"} dicts
    return [r["image"] for r in rows], torch.tensor([r["label"] for r in rows])


ds = datasets.Dataset.from_parquet(str(args.parquet))
# --8<-- [start:wrap]
ds = ds.cast_column("image", datasets.Image(decode=False))
dl = DataLoader(ds, args.batch_size, shuffle=True, num_workers=2, collate_fn=files)
aug = latecast.Augment(resized_crop=0.35, flip=0.5)
train = latecast.wrap(dl, mean=MEAN, std=STD, augment=aug, fields={0: latecast.jpeg(args.size)})
# --8<-- [end:wrap]
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
    torch.nn.Flatten(), torch.nn.Linear(16, 10),
).to(train.device)  # fmt: skip
opt = torch.optim.SGD(model.parameters(), lr=0.05)

seen = 0
for _ in range(args.epochs):
    for images, labels in train:  # float32 (N, 3, S, S) normalized on the device, int64
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        seen += len(labels)
s = train.stats
print(
    f"{seen} photos in {args.epochs} epochs of {len(ds)}, loss {loss.item():.3f}; decoded by "
    f"{s.decoder}; host->device {s.image_bytes} JPEG bytes (uint8 would be {s.decoded_bytes})"
)
