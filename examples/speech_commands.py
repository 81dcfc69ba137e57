"""Keyword spotting, torchaudio's Speech Commands tutorial's shape: 1-s clips at 16 kHz, some
shorter, int16 PCM as the WAV files hold them, a log-mel and a small conv classifier.

The usual pipeline reads float32 (`torchaudio.load`, TorchCodec's `AudioDecoder`), pads each
batch in its `collate_fn` and moves 4 bytes a sample. Read the files as the int16 they hold:
`soundfile.read(path, dtype="int16")`, or the standard library's `wave`:
`np.frombuffer(w.readframes(w.getnframes()), np.int16)` (`torchaudio.load(normalize=False)`
gives float32 since torchaudio 2.9, which loads through TorchCodec). Declared
`latecast.waveform(16000, pad=True, mel=True)`, the clips cross ragged, back to back, as the
2 bytes a sample they are stored in (and each clip's length); on the device they are scaled
to [-1, 1), padded to 1 s and made a log-mel.

python examples/speech_commands.py [--clips 48] [--epochs 2]
(synthetic clips: a tone per word in noise, 0.75 to 1 s long)
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import latecast

RATE = 16000
WORDS = ("yes", "no", "up", "down")


class Commands(Dataset):
    """``(int16 (L,), label)``, L up to 1 s, as `soundfile.read(path, dtype="int16")` reads it."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, len(WORDS), (n,), generator=g)
        sizes = torch.randint(3 * RATE // 4, RATE + 1, (n,), generator=g).tolist()
        t = torch.arange(RATE) / RATE
        self.waves = [
            (
                8000 * torch.sin(2 * math.pi * 400 * (k + 1) * t[:size]) + 2000 * torch.randn(size)
            ).to(torch.int16)
            for k, size in zip(self.labels.tolist(), sizes)
        ]

    def __len__(self) -> int:
        return len(self.waves)

    def __getitem__(self, i: int) -> tuple:
        return self.waves[i], self.labels[i]


def ragged(batch: list) -> tuple:
    """The clips as a list (their lengths differ), the labels stacked."""
    return [w for w, _ in batch], torch.stack([y for _, y in batch])


args = argparse.ArgumentParser()
args.add_argument("--clips", type=int, default=48)
args.add_argument("--epochs", type=int, default=2)
args = args.parse_args()
torch.manual_seed(0)
data = Commands(args.clips)

# --8<-- [start:wrap]
dl = DataLoader(data, batch_size=16, shuffle=True, collate_fn=ragged)  # int16 clips, ragged
train = latecast.wrap(dl, fields={0: latecast.waveform(16000, pad=True, mel=True)})  # 1 s
# --8<-- [end:wrap]
model = torch.nn.Sequential(  # (N, 128 mels, 81 frames) -> a word
    torch.nn.AdaptiveMaxPool1d(1),  # each band's loudest frame: the padding's -100 dB never wins
    torch.nn.Flatten(),
    torch.nn.LayerNorm(128),  # dB relative to the clip's own
    torch.nn.Unflatten(1, (1, 128)),
    torch.nn.Conv1d(1, 8, 5, stride=2, padding=2),  # over the bands
    torch.nn.ReLU(),
    torch.nn.Flatten(),
    torch.nn.Linear(8 * 64, len(WORDS)),
).to(train.device)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
losses = []
for _ in range(args.epochs):
    for (mel, _frames), labels in train:  # float32 dB (N, 128, 81), its frames: int64 (N,)
        loss = F.cross_entropy(model(mel), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
assert all(map(math.isfinite, losses)), losses
s, samples = train.stats, args.epochs * sum(len(w) for w in data.waves)
print(
    f"{len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; {samples:,} samples of "
    f"{args.epochs * len(data)} clips: {s.other_bytes:,} bytes crossed (int16, and each "
    f"clip's length), {4 * samples:,} as float32; {s}"
)
