"""The audio kind (``latecast.waveform``): int16 clips cross as stored and come out as the
float32 pipeline's (x / 32768, cropped, padded, a gain, a log-mel); bad input named; a
speech-commands classifier trains as on float32."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import latecast
from latecast.errors import BatchError, ConfigError

try:
    import torchaudio
except ImportError:  # no hard dependency: the mel is checked against its formula below
    torchaudio = None

RATE = 16000


def clips(n: int, sizes: list[int], channels: int | None = None, seed: int = 0) -> list:
    """``n`` int16 clips of the given sizes (cycled): noise, some of it loud."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n):
        shape = (sizes[k % len(sizes)],) if channels is None else (channels, sizes[k % len(sizes)])
        out.append(torch.randint(-20000, 20000, shape, dtype=torch.int16, generator=g))
    return out


def usual(clip: torch.Tensor, length: int, start: int = 0) -> torch.Tensor:
    """The float32 pipeline's clip (torchaudio.load's x / 32768) cropped at ``start`` or
    zero-padded to ``length``."""
    x = clip.float() / 32768
    x = x[..., start : start + length]
    return F.pad(x, (0, length - x.shape[-1]))


class Clips(Dataset):
    """Clips and their labels, as stored (``float32``: as the usual pipeline makes them)."""

    def __init__(self, waves: list, length: int | None = None) -> None:
        self.waves, self.length = waves, length

    def __len__(self) -> int:
        return len(self.waves)

    def __getitem__(self, i: int):
        w = self.waves[i]
        return (w if self.length is None else usual(w, self.length)), i % 10


def ragged(batch: list) -> tuple:
    """A custom collate: the clips as a list (they differ in length), the labels stacked."""
    return [w for w, _ in batch], torch.tensor([y for _, y in batch])


def test_clips_of_one_length_cross_as_int16_and_equal_the_float32_pipeline():
    waves = clips(12, [RATE + 400], channels=1)
    stored = DataLoader(Clips(waves), batch_size=4)
    floats = DataLoader(Clips([usual(w, RATE + 400)[..., 200:-200] for w in waves]), 4)
    spec = {0: latecast.waveform(RATE, crop="centre")}
    wrapped = latecast.wrap(stored, device="cpu", fields=spec)
    mover = latecast.Mover(device="cpu", fields=spec)
    for (x, y), (m, _), (want, label) in zip(wrapped, map(mover, stored), floats):
        assert x.dtype == torch.float32 and x.shape == (4, 1, RATE)
        torch.testing.assert_close(x, want.to("cpu"), atol=1e-6, rtol=0)
        assert torch.equal(m, x) and torch.equal(y, label)
    s = wrapped.stats
    assert s.other_bytes == 12 * (RATE + 400) * 2  # int16, as stored
    assert s.usual_bytes - s.label_bytes * 8 == 12 * (RATE + 400) * 2  # as they arrived
    assert 12 * (RATE + 400) * 4 / s.other_bytes == 2.0  # float32 (torchaudio.load's): 2.00x


def test_ragged_and_padded_clips_come_out_padded_to_the_declared_length_with_their_lengths():
    sizes = [12000, RATE, 17000, 9000]
    waves = clips(8, sizes)
    want = torch.stack([usual(w, RATE) for w in waves])
    lengths = torch.tensor([min(len(w), RATE) for w in waves])
    loader = DataLoader(Clips(waves), batch_size=4, collate_fn=ragged)
    spec = latecast.waveform(RATE, pad=True, crop="start")
    got = list(latecast.wrap(loader, device="cpu", fields={0: spec}))
    torch.testing.assert_close(torch.cat([b[0].audio for b in got]), want, atol=1e-6, rtol=0)
    assert torch.equal(torch.cat([b[0].lengths for b in got]), lengths)

    def padded(batch):  # torchaudio's tutorial shape: zero-padded to the longest, its lengths
        waves, labels = ragged(batch)
        n = torch.tensor([len(w) for w in waves])
        return torch.nn.utils.rnn.pad_sequence(waves, batch_first=True), n, labels

    loader = DataLoader(Clips(waves), batch_size=4, collate_fn=padded)
    spec = latecast.waveform(RATE, pad=True, crop="start", lengths=1)
    got = list(latecast.wrap(loader, device="cpu", fields={0: spec}))
    torch.testing.assert_close(torch.cat([b[0].audio for b in got]), want, atol=1e-6, rtol=0)
    assert torch.equal(torch.cat([b[0].lengths for b in got]), lengths)


@pytest.mark.parametrize("dtype, scale, zero", [(torch.uint8, 128, 128), (torch.int32, 2**31, 0)])
def test_other_widths_are_scaled_as_torchaudio_load_scales_them(dtype, scale, zero):
    """8-bit WAV (silence at 128) and 32-bit PCM, padded past their longest with 0.0."""
    info = torch.iinfo(dtype)
    g = torch.Generator().manual_seed(0)
    waves = torch.randint(info.min, info.max, (3, 2, 1000), dtype=torch.int64, generator=g)
    lengths = torch.tensor([1000, 700, 10])
    stored = waves.to(dtype)
    spec = latecast.waveform(1200, dtype=dtype, pad=True, lengths="n")
    out = latecast.Mover(device="cpu", fields={"a": spec})({"a": stored, "n": lengths})["a"]
    want = (waves.double() - zero) / scale  # (x - 128) / 128, x / 2**31: torchaudio.load's
    want = want * (torch.arange(1000) < lengths[:, None, None])
    torch.testing.assert_close(out.audio, F.pad(want, (0, 200)).float(), atol=1e-6, rtol=0)
    assert out.lengths.tolist() == lengths.tolist()


def test_stereo_ragged_clips_keep_their_channels():
    waves = clips(3, [15000, 17000, 16100], channels=2)
    out = latecast.Mover(
        device="cpu", fields={"a": latecast.waveform(RATE, pad=True, crop="centre")}
    )({"a": waves})["a"]
    spare = [max(w.shape[-1] - RATE, 0) // 2 for w in waves]
    want = torch.stack([usual(w, RATE, s) for w, s in zip(waves, spare)])
    assert out.audio.shape == (3, 2, RATE)
    torch.testing.assert_close(out.audio, want, atol=1e-6, rtol=0)
    assert out.lengths.tolist() == [15000, RATE, RATE]


def test_random_crops_and_gains_are_per_clip_in_range_and_the_same_for_the_same_seed():
    waves = clips(6, [RATE + 300, RATE + 1000, RATE])
    batch = ([w.numpy() for w in waves],)  # numpy arrays, as a collate of one's own gives them

    def run(seed, gain=None, position=0):
        mover = latecast.Mover(
            device="cpu", seed=seed, fields={0: latecast.waveform(RATE, gain=gain)}
        )
        mover.position = position
        return mover(batch)[0]

    plain = run(0)
    for k, (w, row) in enumerate(zip(waves, plain)):
        windows = usual(w, len(w)).unfold(0, RATE, 1)  # every crop the clip has
        assert (windows == row).all(1).sum() >= 1, f"clip {k} is no crop of itself"
    assert torch.equal(run(0), plain) and not torch.equal(run(0, position=1), plain)
    assert not torch.equal(run(1), plain)
    loud = run(0, gain=(-6.0, 3.0))  # crops drawn first: the same crops, then a gain
    per_clip = (loud / plain.where(plain != 0, 1)).median(1).values  # |samples| < 0.62: no clamp
    torch.testing.assert_close(loud, plain * per_clip[:, None], rtol=1e-5, atol=1e-6)
    assert (10 ** (-6 / 20) <= per_clip).all() and (per_clip <= 10 ** (3 / 20)).all()
    assert per_clip.std() > 0  # drawn per clip


def mel_reference(x: torch.Tensor, rate: int, n_fft: int, hop: int, n_mels: int) -> torch.Tensor:
    """torchaudio's MelSpectrogram + AmplitudeToDB by their formulas, in float64 (reflect
    padding, periodic Hann, HTK triangles from 0 to rate / 2, 10 log10(max(x, 1e-10)))."""
    x = F.pad(x.double()[None], (n_fft // 2, n_fft // 2), mode="reflect")[0]
    frames = x.unfold(-1, n_fft, hop)  # (..., frames, n_fft)
    k = torch.arange(n_fft, dtype=torch.float64)
    window = 0.5 - 0.5 * torch.cos(2 * math.pi * k / n_fft)
    f = torch.arange(n_fft // 2 + 1, dtype=torch.float64)
    angle = 2 * math.pi * f[:, None] * k[None] / n_fft
    re, im = (frames * window) @ torch.cos(angle).T, (frames * window) @ torch.sin(angle).T
    power = re**2 + im**2  # (..., frames, freqs)
    hz = torch.linspace(0, rate // 2, n_fft // 2 + 1, dtype=torch.float64)
    top = 2595 * math.log10(1 + (rate / 2) / 700)
    edges = 700 * (10 ** (torch.linspace(0, top, n_mels + 2, dtype=torch.float64) / 2595) - 1)
    bank = torch.zeros(len(hz), n_mels, dtype=torch.float64)
    for m in range(n_mels):  # triangle m rises from edge m to m + 1, falls to m + 2
        left, centre, right = edges[m : m + 3].tolist()
        rise, fall = (hz - left) / (centre - left), (right - hz) / (right - centre)
        bank[:, m] = torch.minimum(rise, fall).clamp(min=0)
    return (10 * torch.log10((power @ bank).clamp(min=1e-10))).transpose(-1, -2)


def test_the_log_mel_on_the_device_is_torchaudios_by_its_formula():
    waves = torch.stack(clips(3, [RATE]))
    spec = latecast.waveform(RATE, crop="start", mel=dict(n_fft=512, hop_length=160, n_mels=40))
    got = latecast.Mover(device="cpu", fields={0: spec})((waves,))[0]
    want = mel_reference(waves.float() / 32768, RATE, 512, 160, 40)
    assert got.shape == (3, 40, RATE // 160 + 1)
    torch.testing.assert_close(got.double(), want, atol=2e-3, rtol=1e-4)


@pytest.mark.skipif(torchaudio is None, reason="torchaudio is not installed")
@pytest.mark.parametrize(
    "options",
    [{}, {"n_mels": 64, "f_min": 20.0, "f_max": 7600.0, "top_db": 80.0}, {"log": "log"}],
)
def test_the_log_mel_equals_torchaudios_in_the_workers(options):
    waves = clips(4, [RATE + 800], channels=1)
    loader = DataLoader(Clips(waves), batch_size=4)
    spec = latecast.waveform(RATE, crop="centre", mel=options)
    ((got, _),) = latecast.wrap(loader, device="cpu", fields={0: spec})
    kw = {k: v for k, v in options.items() if k not in ("log", "top_db")}
    mel, db = torchaudio.transforms.MelSpectrogram(RATE, **kw), torchaudio.transforms.AmplitudeToDB
    log = (
        (lambda s: torch.log(s + 1e-6)) if options.get("log") else db(top_db=options.get("top_db"))
    )
    want = torch.stack([log(mel(usual(w, RATE, 400))) for w in waves])  # (4, 1, n_mels, 81)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    "value, spec, says",
    [
        (torch.zeros(2, RATE), {}, "is declared torch.int16 audio but is torch.float32"),
        (torch.zeros(2, 1, 1, RATE, dtype=torch.int16), {}, "give (N, L) or (N, C, L)"),
        (torch.zeros(RATE, dtype=torch.int16), {}, "give (N, L) or (N, C, L)"),
        (torch.zeros(2, 9000, dtype=torch.int16), {}, "clip at position 0 has 9000 samples"),
        ([torch.zeros(RATE, dtype=torch.int16)] * 2 + [torch.zeros(10, dtype=torch.int16)], {},
         "clip at position 2 has 10 samples"),
        (torch.full((2, RATE), 40000, dtype=torch.int32), {}, "samples 40000..40000 do not fit"),
        (torch.full((2, RATE), -1, dtype=torch.int16), {"dtype": torch.uint8}, "-1..-1 do not fit"),
        (["not a clip"], {}, "is declared audio but is list"),
        (torch.zeros(2, RATE, dtype=torch.int16), {"lengths": "n"}, "lengths field 'n' must"),
    ],
)  # fmt: skip
def test_bad_input_is_one_batch_error_naming_the_field(value, spec, says):
    mover = latecast.Mover(device="cpu", fields={"audio": latecast.waveform(RATE, **spec)})
    with pytest.raises(BatchError, match="field 'audio'") as err:
        mover({"audio": value, "n": torch.tensor([RATE + 1, 5])})
    assert says in str(err.value)


@pytest.mark.parametrize("pad", [False, True])
def test_clips_shorter_than_n_fft_without_centring_are_refused_naming_the_field(pad):
    """Refused when planned, naming field, length and n_fft (not torch.stft's RuntimeError);
    clips of n_fft samples make one frame."""
    mel = {"center": False, "n_fft": 400, "n_mels": 16}
    short = latecast.Mover(device="cpu", fields={"audio": latecast.waveform(300, pad=pad, mel=mel)})
    says = r"^field 'audio': clips of 300 samples .*n_fft \(400\) with center=False"
    with pytest.raises(ConfigError, match=says):
        short({"audio": torch.zeros(2, 300, dtype=torch.int16)})
    with pytest.raises(ConfigError, match=says):
        short({"audio": [torch.zeros(300, dtype=torch.int16), torch.zeros(200, dtype=torch.int16)]})
    fits = latecast.Mover(device="cpu", fields={"audio": latecast.waveform(400, mel=mel)})
    assert fits({"audio": torch.zeros(2, 400, dtype=torch.int16)})["audio"].shape == (2, 16, 1)


@pytest.mark.parametrize(
    "options, says",
    [
        ({"length": 0}, "length"),
        ({"dtype": torch.float32}, "dtype"),
        ({"crop": "middle"}, "crop"),
        ({"gain": (3, -3)}, "gain"),
        ({"mel": {"n_mel": 40}}, "unknown option 'n_mel'"),
        ({"mel": {"f_max": 9000.0}}, "f_max"),
        ({"mel": {"log": "ln"}}, "log"),
        ({"length": 100, "mel": True}, "length"),
    ],
)
def test_bad_options_are_one_config_error_naming_them(options, says):
    with pytest.raises(ConfigError, match="latecast.waveform") as err:
        latecast.waveform(**{"length": RATE, **options})
    assert says in str(err.value)


def test_the_lightning_hook_draws_no_gain_or_crop_in_evaluation():
    """In evaluation the clips come out centred, without gain, whatever the seed (as
    ``augment`` is left to training): through the hook and a real ``Trainer``'s validation."""
    from _helpers import hooked_fit, lightning_hook

    waves = torch.stack(clips(4, [3000], channels=1))  # (4, 1, 3000): cropped to 1600
    centred = torch.stack([usual(w, 1600, start=700) for w in waves])  # (4, 1, 1600)
    fields = {"audio": latecast.waveform(1600, gain=(-6.0, 6.0))}
    batch = {"audio": waves, "y": torch.arange(4)}
    for where in [(0, 0, 0), (3, 1, 7)]:
        seen = lightning_hook(batch, where, training=False, fields=fields)["audio"]
        torch.testing.assert_close(seen, centred, atol=0, rtol=0)
    trained = lightning_hook(batch, (0, 0, 0), training=True, fields=fields)["audio"]
    assert trained.shape == centred.shape and not torch.equal(trained, centred)  # drawn

    pytest.importorskip("lightning")
    data = DataLoader(list(zip(waves, range(4))), batch_size=2)
    fields = {0: latecast.waveform(1600, gain=(-6.0, 6.0))}
    model = hooked_fit(data, data, dict(max_epochs=1, num_sanity_val_steps=0), fields=fields)
    trained, evaluated = ([b[0] for b in m] for m in (model.trained, model.validated))
    assert len(evaluated) == len(trained) == 2
    torch.testing.assert_close(torch.cat(evaluated), centred, atol=0, rtol=0)
    assert not torch.equal(torch.cat(trained), centred)


class M5(torch.nn.Module):
    """torchaudio's speech-commands classifier's shape, smaller."""

    def __init__(self, classes: int = 10, width: int = 8) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv1d(1, width, kernel_size=80, stride=16)
        self.bn1 = torch.nn.BatchNorm1d(width)
        self.conv2 = torch.nn.Conv1d(width, width, kernel_size=3)
        self.bn2 = torch.nn.BatchNorm1d(width)
        self.fc = torch.nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool1d(F.relu(self.bn1(self.conv1(x))), 4)
        x = F.max_pool1d(F.relu(self.bn2(self.conv2(x))), 4)
        return F.log_softmax(self.fc(x.mean(-1)), -1)


def train(model: torch.nn.Module, batches, wave=lambda x: x, opt=None) -> list[float]:
    """The tutorial's loop: its Adam, unless ``opt`` makes another optimizer of the model."""
    opt = (opt or (lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=1e-4)))(model.parameters())
    losses = []
    for x, y in batches:
        loss = F.nll_loss(model(wave(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_a_speech_commands_classifier_trains_as_on_the_float32_pipeline():
    """1-s int16 clips, some shorter (padded): the same losses and weights as on float32."""
    waves = clips(24, [RATE, 14000, 15500], channels=1, seed=3)
    torch.manual_seed(0)
    model = M5()
    twin = copy.deepcopy(model)

    def floats(batch):  # the usual: float32 in the worker, padded to 1 s
        return torch.stack([usual(w, RATE) for w, _ in batch]), torch.tensor([y for _, y in batch])

    usual_loader = DataLoader(Clips(waves), batch_size=8, shuffle=False, collate_fn=floats)
    want = train(model, usual_loader)
    loader = DataLoader(Clips(waves), batch_size=8, collate_fn=ragged)
    spec = latecast.waveform(RATE, pad=True, crop="start")
    wrapped = latecast.wrap(loader, device="cpu", fields={0: spec})
    got = train(twin, wrapped, wave=lambda clips: clips.audio)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for p, q in zip(twin.parameters(), model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    assert wrapped.stats.other_bytes < 24 * RATE * 4 / 2 + 24 * 8 + 1  # int16 and the lengths


class WavFiles(Dataset):
    """WAV files read as the docs say, ``wave``'s frames as int16 (``float32``: / 32768)."""

    def __init__(self, paths: list, float32: bool = False) -> None:
        self.paths, self.float32 = paths, float32

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        import wave

        with wave.open(str(self.paths[i]), "rb") as w:
            n, c = w.getnframes(), w.getnchannels()
            x = torch.from_numpy(np.frombuffer(w.readframes(n), np.int16).reshape(n, c).T.copy())
        return (usual(x, RATE) if self.float32 else x), i % 10


def test_wav_files_read_as_the_docs_say_equal_the_float32_pipeline(tmp_path):
    """Read the documented ways (``wave``, soundfile's int16, TorchCodec scaled back: the same
    integers), through ``wrap``: the float32 pipeline's batches; float32 batches are refused
    naming those ways."""
    import wave

    waves, paths = clips(6, [RATE, 12000], channels=2, seed=3), []
    waves[0][0, :2] = torch.tensor([-32768, 32767], dtype=torch.int16)  # the ends of int16
    for k, x in enumerate(waves):
        paths.append(tmp_path / f"{k}.wav")
        with wave.open(str(paths[-1]), "wb") as w:
            w.setnchannels(2), w.setsampwidth(2), w.setframerate(RATE)
            w.writeframes(x.T.contiguous().numpy().tobytes())  # interleaved, as WAV holds them
    stored = [WavFiles(paths)[k][0] for k in range(6)]
    assert all(torch.equal(a, b) for a, b in zip(stored, waves))
    try:
        import soundfile
    except ImportError:
        soundfile = None
    if soundfile is not None:
        read = [torch.from_numpy(soundfile.read(p, dtype="int16")[0].T.copy()) for p in paths]
        assert all(torch.equal(a, b) for a, b in zip(read, waves))
    try:
        from torchcodec.decoders import AudioDecoder

        decoded = [AudioDecoder(str(p)).get_all_samples().data for p in paths]
    except (ImportError, RuntimeError, OSError):  # no TorchCodec, or no FFmpeg it can load
        decoded = None
    if decoded is not None:
        back = [(x * 32768).round().clamp(-32768, 32767).to(torch.int16) for x in decoded]
        assert all(torch.equal(a, b) for a, b in zip(back, waves))
    loader = DataLoader(WavFiles(paths), batch_size=3, collate_fn=ragged)
    spec = {0: latecast.waveform(RATE, pad=True, crop="start")}
    got = list(latecast.wrap(loader, device="cpu", fields=spec))
    want = list(DataLoader(WavFiles(paths, float32=True), batch_size=3))
    assert len(got) == len(want) == 2
    for ((x, n), y), (wx, wy) in zip(got, want):
        assert x.dtype == torch.float32 and x.shape == (3, 2, RATE)
        torch.testing.assert_close(x, wx, atol=0, rtol=0)
        assert torch.equal(y, wy) and n.tolist() == [w.shape[-1] for w in waves[y[0] : y[0] + 3]]
    mover = latecast.Mover(device="cpu", fields=spec)
    with pytest.raises(BatchError, match="^field 0 is declared torch.int16 audio") as err:
        mover(next(iter(DataLoader(WavFiles(paths, float32=True), batch_size=3))))
    for way in (
        "soundfile.read(path, dtype='int16')",
        "np.frombuffer(w.readframes(n), np.int16)",
        "AudioDecoder",
        "(x * 32768).round().clamp(-32768, 32767).to(torch.int16)",
    ):
        assert way in str(err.value)


class SpeechFolder(Dataset):
    """A folder of WAV files per word, read by soundfile as ``(1, L)``, labelled by folder."""

    def __init__(self, root, dtype: str) -> None:
        self.paths, self.dtype = sorted(root.glob("*/*.wav")), dtype
        self.words = sorted({p.parent.name for p in self.paths})

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        import soundfile

        x, _ = soundfile.read(self.paths[i], dtype=self.dtype)  # "float32": x / 32768
        return torch.from_numpy(x)[None], torch.tensor(self.words.index(self.paths[i].parent.name))


def tutorial_collate(batch: list) -> tuple:
    """The tutorial's ``collate_fn``: clips zero-padded to the longest, ``(N, 1, longest)``."""
    tensors = [w.t() for w, _ in batch]
    tensors = torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True, padding_value=0.0)
    return tensors.permute(0, 2, 1), torch.stack([y for _, y in batch])


def test_the_speech_commands_tutorial_converted_as_the_docs_say_trains_the_same(tmp_path):
    """pytorch/tutorials' speech-commands M5 converted as docs/dataloader.md says (int16 read,
    ``waveform(longest, pad=True)``, cut back per batch): the same batches and losses."""
    soundfile = pytest.importorskip("soundfile")
    sizes = [4000, 3000, 2400, 3600, 2000, 3200]  # the second batch of 4 is shorter than 4000
    waves = clips(12, sizes, seed=5)
    for k, x in enumerate(waves):
        (tmp_path / f"w{k % 3}").mkdir(exist_ok=True)
        soundfile.write(tmp_path / f"w{k % 3}" / f"{k:02}.wav", x.numpy(), RATE, subtype="PCM_16")

    def loader(dtype):
        g = torch.Generator().manual_seed(0)
        data = SpeechFolder(tmp_path, dtype)
        return DataLoader(
            data, batch_size=4, shuffle=True, generator=g, collate_fn=tutorial_collate
        )

    def converted():  # what the docs change: int16 read, declared, each batch cut back
        spec = latecast.waveform(4000, pad=True)  # the longest clip: Speech Commands' 16000
        return latecast.wrap(loader("int16"), device="cpu", fields={0: spec})

    def longest(x):  # Padded(audio, lengths): the tutorial's batch, padded to its longest
        return x.audio[..., : int(x.lengths.max())]

    want, got = list(loader("float32")), [(longest(x), y) for x, y in converted()]
    assert len(got) == len(want) == 3 and len({x.shape[-1] for x, _ in want}) > 1
    for (x, y), (wx, wy) in zip(got, want):
        assert x.dtype == wx.dtype == torch.float32 and x.shape == wx.shape
        torch.testing.assert_close(x, wx, atol=0, rtol=0)  # k / 32768: exact in float32
        assert torch.equal(y, wy)

    torch.manual_seed(0)
    model = M5(classes=3)
    twin = copy.deepcopy(model)
    sgd = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    want = train(model, loader("float32"), opt=sgd)
    wrapped = converted()
    got = train(twin, wrapped, wave=longest, opt=sgd)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for p, q in zip(twin.parameters(), model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    assert wrapped.stats.other_bytes <= 12 * 4000 * 2 + 12 * 8  # int16, padded to the longest
