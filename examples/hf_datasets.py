"""A Hugging Face `datasets` table through latecast.wrap (needs `pip install datasets`).

`datasets` formats uint8 image columns for torch as int64: declared as an image,
`fields={"image": "image"}`, the column crosses as uint8 and is normalized on the device.
The streaming form (`IterableDataset`, shuffled by a buffer) draws its order from its own
epoch, which `wrapped.set_epoch(e)` passes on, as it does to a sampler.

python examples/hf_datasets.py [--limit 2000] [--epochs 2]
(the table is made from the bundled MNIST, no download; `load_dataset("mnist")` works alike)
"""

import argparse

import datasets
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import latecast

MEAN, STD = (0.1307,), (0.3081,)  # MNIST's

args = argparse.ArgumentParser()
args.add_argument("--limit", type=int, default=2000)
args.add_argument("--epochs", type=int, default=2)
args = args.parse_args()
mnist = latecast.load_dataset("mnist")
table = datasets.Dataset.from_dict(
    {"image": mnist.images[: args.limit], "label": mnist.labels[: args.limit]}
)  # (28, 28, 1) uint8 per row, as a PIL image column would be after decoding

# --8<-- [start:wrap]
stream = table.to_iterable_dataset(num_shards=4).shuffle(seed=0, buffer_size=256)
stream = stream.with_format("torch")  # int64 images: IterableDataset.with_format has no dtype=
train = latecast.wrap(
    DataLoader(stream, batch_size=128), mean=MEAN, std=STD, fields={"image": "image"}
)
# --8<-- [end:wrap]
model = torch.nn.Sequential(
    torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
).to(train.device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
firsts = []
for epoch in range(args.epochs):
    train.set_epoch(epoch)  # a new shuffle order each epoch
    for k, batch in enumerate(train):  # batch["image"]: float32 (N, 1, 28, 28), normalized
        loss = F.cross_entropy(model(batch["image"]), batch["label"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if k == 0:
            firsts.append(batch["label"][:8].tolist())
    print(f"epoch {epoch}: loss {loss.item():.3f}, first labels {firsts[-1]}")
assert len({str(f) for f in firsts}) == len(firsts), "the same order twice"
s = train.stats
print(
    f"{s.image_bytes:,} image bytes crossed as uint8, {s.usual_bytes:,} as the int64 they arrive in"
)
