"""Action recognition, torchvision's video classification reference's shape: clips of 8 frames
decoded to uint8 `(T, H, W, C)` in the DataLoader, cropped, flipped, normalized and given to a
3-D conv net as `(N, C, T, H, W)`.

The usual pipeline converts each clip to float32 in the workers (`ConvertImageDtype`,
`Normalize`) and moves 4 bytes a value. Declared `latecast.clip(frames=8, size=32)`, the
frames cross as the uint8 the decoder gave, a quarter of that, and are cropped (one box per
clip, for all its frames), flipped and normalized on the device.

With `--files` the DataLoader yields each clip as an mp4 file (H.264, encoded here by PyAV)
and the field is declared `latecast.video(frames=6, size=32)`: 6 of its 8 frames from a start
drawn from the batch's seed, decoded on the host to YUV 4:2:0 planes (1.5 bytes a pixel; on a
CUDA device with TorchCodec the files cross and NVDEC decodes them), made RGB, resized,
flipped and normalized on the device.

python examples/video_clips.py [--clips 24] [--epochs 2] [--files]
(synthetic clips: a bright square moving up, moving down, or still; 40x40 frames)
"""

import argparse
import io
import math

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import latecast

MEAN, STD = (0.43216, 0.394666, 0.37645), (0.22803, 0.22145, 0.216989)  # torchvision's video
FRAMES, SIDE = 8, 40
MOTIONS = ("up", "down", "still")  # not left or right: a flip would change the label


class Clips(Dataset):
    """``(uint8 (T, H, W, C), label)``, as torchvision.io / PyAV decode a clip."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, len(MOTIONS), (n,), generator=g)
        shape = (n, FRAMES, SIDE, SIDE, 3)
        self.clips = torch.randint(0, 60, shape, generator=g, dtype=torch.uint8)  # dim noise
        corners = torch.randint(14, 19, (n, 2), generator=g)  # 2 pixels a frame stay inside
        for clip, label, (y, x) in zip(self.clips, self.labels, corners):
            step = (-2, 2, 0)[label]
            for t in range(FRAMES):
                top = y + step * t
                clip[t, top : top + 8, x : x + 8] = 255

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i: int) -> tuple:
        return self.clips[i], self.labels[i]


class Files(Dataset):
    """The same clips as mp4 files: ``(bytes, label)``, as a folder of videos read gives them."""

    def __init__(self, clips: Clips) -> None:
        import av  # PyAV: pip install 'latecast[video]'

        self.labels, self.files = clips.labels, []
        for clip in clips.clips.numpy():
            buf = io.BytesIO()
            with av.open(buf, "w", format="mp4") as out:
                stream = out.add_stream("libx264", rate=25)
                stream.width, stream.height, stream.pix_fmt = SIDE, SIDE, "yuv420p"
                for frame in clip:
                    out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
                out.mux(stream.encode())
            self.files.append(buf.getvalue())

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple:
        return self.files[i], self.labels[i]


def files_and_labels(items: list) -> tuple:
    return [f for f, _ in items], torch.stack([label for _, label in items])


args = argparse.ArgumentParser()
args.add_argument("--clips", type=int, default=24)
args.add_argument("--epochs", type=int, default=2)
args.add_argument("--files", action="store_true", help="mp4 files, latecast.video")
args = args.parse_args()
torch.manual_seed(0)
data = Clips(args.clips)

if args.files:
    # --8<-- [start:files]
    dl = DataLoader(Files(data), 8, shuffle=True, collate_fn=files_and_labels)  # mp4 bytes
    train = latecast.wrap(
        dl,
        mean=MEAN,
        std=STD,
        augment=latecast.Augment(flip=0.5),  # one draw a clip, for all its frames
        fields={0: latecast.video(frames=6, size=32)},  # 6 of 8 frames, from a random start
    )
    # --8<-- [end:files]
else:
    # --8<-- [start:wrap]
    dl = DataLoader(data, batch_size=8, shuffle=True)  # uint8 (N, T, H, W, C)
    train = latecast.wrap(
        dl,
        mean=MEAN,
        std=STD,
        augment=latecast.Augment(flip=0.5),  # one draw a clip, for all its frames
        fields={0: latecast.clip(frames=8, size=32)},  # a random 32x32 crop under the Augment
    )
    # --8<-- [end:wrap]
model = torch.nn.Sequential(  # (N, 3, T, 32, 32) -> a motion
    torch.nn.Conv3d(3, 8, 3, padding=1),
    torch.nn.ReLU(),
    torch.nn.AdaptiveMaxPool3d(1),  # the moving square's strongest response
    torch.nn.Flatten(),
    torch.nn.Linear(8, len(MOTIONS)),
).to(train.device)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
losses = []
for _ in range(args.epochs):
    for clips, labels in train:  # float32 (N, C, T, H, W), normalized; int64
        loss = F.cross_entropy(model(clips), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
assert all(map(math.isfinite, losses)), losses
s, values = train.stats, args.epochs * data.clips.numel()
if args.files:  # the usual way: decoded, resized and cropped in the workers, float32
    values = args.epochs * args.clips * 6 * 32 * 32 * 3
crossed = "as YUV 4:2:0 planes" if args.files else "as uint8"
print(
    f"{len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; {s.image_bytes:,} bytes "
    f"crossed {crossed}, {4 * values:,} as float32 frames ({4 * values / s.image_bytes:.2f}x); {s}"
)
