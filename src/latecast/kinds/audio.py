"""The audio kind: waveforms cross as they are stored (int16 PCM, or another declared integer
width: 2x fewer bytes than float32 for int16) and become float on the device, scaled as
decoders give float32 (int16 / 32768: ``torchaudio.load``, TorchCodec's ``AudioDecoder``),
cropped or padded in time to a declared length, given a random gain and, when asked, made a
log-mel spectrogram with ``torch.stft`` (torchaudio's ``MelSpectrogram`` and
``AmplitudeToDB``, without depending on torchaudio). The samples must reach the DataLoader as
the integers stored (``waveform``'s ``dtype`` says how to read them so), as ``(N, [C,] L)``, a
list of ``(L_i,)`` or ``(C, L_i)`` clips (ragged: they cross back to back), or padded beside
an integer field of each clip's length (``lengths=``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import BatchError, ConfigError, check, refuse
from ..fields import Context, Field, Name, as_tensor, check_fits, integral, numpy_dtype

WIDTHS = (torch.int16, torch.int32, torch.int8, torch.uint8)  # what a field may be stored in
CROPS = ("random", "centre", "start")


class Padded(NamedTuple):
    """A field declared ``pad=True``: its clips and, per clip, how much of the last axis holds
    it (samples, or mel frames; int64 on the device); the rest is zeros (or their mel)."""

    audio: torch.Tensor
    lengths: torch.Tensor


@dataclass(frozen=True)
class Mel:
    """A log-mel spectrogram: torchaudio's ``MelSpectrogram`` options (Hann window, HTK mel
    scale, no filter norm), then ``log``: ``"db"`` (``AmplitudeToDB``: 10 log10 of the power,
    ``top_db`` below each clip's peak), ``"log"`` (log(x + ``eps``)) or None."""

    sample_rate: int = 16000
    n_fft: int = 400
    win_length: int | None = None  # None: n_fft
    hop_length: int | None = None  # None: win_length // 2
    f_min: float = 0.0  # Hz
    f_max: float | None = None  # Hz; None: sample_rate / 2
    n_mels: int = 128
    power: float = 2.0
    center: bool = True
    pad_mode: str = "reflect"
    log: str | None = "db"
    top_db: float | None = None
    eps: float = 1e-6

    @property
    def hop(self) -> int:
        return self.hop_length or (self.win_length or self.n_fft) // 2

    def frames(self, samples: torch.Tensor) -> torch.Tensor:
        """The frames whose window holds the first ``samples`` samples (torch.stft's count)."""
        if self.center:
            return samples // self.hop + 1
        return ((samples - self.n_fft) // self.hop + 1).clamp(min=0)

    @functools.lru_cache(maxsize=8)  # noqa: B019 (a few frozen Mels, a few devices)
    def filters(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The window ``(win,)`` and the triangular filters ``(n_fft // 2 + 1, n_mels)`` as
        torchaudio's ``melscale_fbanks`` builds them, on ``device``."""
        top = self.sample_rate / 2 if self.f_max is None else self.f_max
        freqs = torch.linspace(0, self.sample_rate // 2, self.n_fft // 2 + 1)
        points = torch.linspace(_mel_of(self.f_min), _mel_of(top), self.n_mels + 2)
        points = 700.0 * (10 ** (points / 2595.0) - 1.0)  # the filters' edges, Hz
        widths = points.diff()
        slopes = points[None, :] - freqs[:, None]  # (freqs, n_mels + 2)
        up, down = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
        bank = torch.minimum(up, down).clamp(min=0)
        window = torch.hann_window(self.win_length or self.n_fft)
        return window.to(device), bank.to(device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., L)`` float waveforms to ``(..., n_mels, frames)``; ``top_db`` is applied
        per leading index (a clip's channels together: ``x`` is ``(N, C, L)``)."""
        window, bank = self.filters(x.device)
        flat = x.reshape(-1, x.shape[-1])
        spec = torch.stft(flat, self.n_fft, self.hop, len(window), window, self.center,
                          self.pad_mode, return_complex=True).abs().pow(self.power)  # fmt: skip
        out = (spec.transpose(1, 2) @ bank).transpose(1, 2)  # (N * C, n_mels, frames)
        out = out.reshape(*x.shape[:-1], *out.shape[1:])
        if self.log == "log":
            return torch.log(out + self.eps)
        if self.log != "db":
            return out
        out = (20.0 / self.power) * torch.log10(out.clamp(min=1e-10))  # dB of the power
        if self.top_db is not None:
            peak = out.flatten(1).amax(1) - self.top_db  # (N,)
            out = torch.maximum(out, peak.view(-1, *[1] * (out.ndim - 1)))
        return out


def _mel_of(hz: float) -> float:
    return 2595.0 * math.log10(1.0 + hz / 700.0)  # the HTK mel scale


@dataclass(frozen=True)
class WaveformSpec:
    """A waveform field's declaration (``waveform``); ``plan`` checks a batch of it on the host
    (a BatchError naming the field for what it cannot take)."""

    length: int  # samples each clip comes out with
    dtype: torch.dtype = torch.int16  # as stored, and as it crosses
    crop: str = "random"
    pad: bool = False
    gain: tuple[float, float] | None = None  # dB
    mel: Mel | None = None
    lengths: Name | None = None  # the field holding each padded clip's length

    def plan(self, name: Name, value: Any, options: Any, batch: dict) -> Waveforms:
        mel = self.mel
        if mel is not None and not mel.center and self.length < mel.n_fft:  # stft would fail
            raise ConfigError(
                f"field {name!r}: clips of {self.length} samples are shorter than the mel's "
                f"n_fft ({mel.n_fft}) with center=False: no frame fits; declare a length of at "
                "least n_fft, a smaller n_fft, or center=True"
            )
        t = as_tensor(value)
        ragged = t is None  # a list of clips
        clips = _clips(name, value) if ragged else [t]
        ranks = {c.ndim for c in clips} if ragged else {t.ndim - 1}
        if ranks - {1, 2} or len(ranks) > 1 or len({c.shape[:-1] for c in clips}) > 1:
            raise BatchError(
                f"field {name!r} is declared audio: give (N, L) or (N, C, L), or a list of (L,) "
                f"or (C, L) clips of one C, got {_shapes(clips)}"
            )
        for c in clips:
            self._check_values(name, c)
        lens = self._lengths(name, t, clips, batch)
        crosses = ragged or self.lengths is not None  # the lengths (full rows: nothing more)
        short = np.flatnonzero(lens.numpy() < self.length)
        if len(short) and not self.pad:
            k = int(short[0])
            raise BatchError(
                f"field {name!r}: the clip at position {k} has {int(lens[k])} samples, fewer "
                f"than the declared length {self.length}; declare pad=True to pad it with zeros"
            )
        mono = ranks == {1}
        channels = 1 if mono else clips[0].shape[-2]  # (C, L) clips, or (N, C, L)
        shape = (sum(c.numel() for c in clips),) if ragged else tuple(t.shape)
        return Waveforms(name, self.dtype, shape, clips[0].dtype, self, len(lens), channels, mono,
                       lens if crosses else None, clips if ragged else None)  # fmt: skip

    def evaluated(self) -> WaveformSpec:
        """This declaration for evaluation (``PrepareOnDevice`` when not ``training``): no
        draws of its own, no gain and a random crop centred."""
        crop = "centre" if self.crop == "random" else self.crop
        return dataclasses.replace(self, gain=None, crop=crop)

    def _check_values(self, name: Name, clip: torch.Tensor) -> None:
        """Integers that the declared width holds (read only where the source's may not)."""
        if not integral(clip.dtype):
            raise BatchError(
                f"field {name!r} is declared {self.dtype} audio but is {clip.dtype}: yield the "
                "samples as stored: soundfile.read(path, dtype='int16'), or the wave module's "
                "np.frombuffer(w.readframes(n), np.int16) (torchaudio.load and TorchCodec's "
                "AudioDecoder give float32; only if one must read, scale back with "
                "(x * 32768).round().clamp(-32768, 32767).to(torch.int16))"
            )
        check_fits(name, clip, self.dtype, what="samples")

    def _lengths(self, name: Name, t: torch.Tensor | None, clips: list, batch: dict):
        """Each clip's samples as stored, int64 ``(N,)`` on the host."""
        if t is None:
            return torch.tensor([c.shape[-1] for c in clips], dtype=torch.int64)
        if self.lengths is None:
            return torch.full((len(t),), t.shape[-1], dtype=torch.int64)
        given = as_tensor(batch.get(self.lengths))
        ok = given is not None and integral(given.dtype) and tuple(given.shape) == (len(t),)
        lens = given.cpu().long() if ok else None
        if not ok or (len(lens) and not (0 <= lens.min() and lens.max() <= t.shape[-1])):
            raise BatchError(
                f"field {name!r}: its lengths field {self.lengths!r} must hold {len(t)} integers "
                f"in 0..{t.shape[-1]}, got {given if given is None else _shapes([given])}"
            )
        return lens


def _clips(name: Name, value: Any) -> list[torch.Tensor]:
    clips = [as_tensor(c) for c in value] if isinstance(value, (list, tuple)) and value else []
    if not clips or any(c is None or c.device.type != "cpu" for c in clips):
        raise BatchError(
            f"field {name!r} is declared audio but is {type(value).__name__}: give a tensor "
            "(N, L) or (N, C, L), or a non-empty list of (L,) or (C, L) host tensors or arrays"
        )
    return clips


def _shapes(clips: list) -> str:
    return ", ".join(f"{c.dtype} {tuple(c.shape)}" for c in clips[:3]) + " ..." * (len(clips) > 3)


@dataclass(frozen=True)
class Waveforms(Field):
    """The audio kind: the samples (rows, or ragged clips back to back) then, where clips are
    ragged or padded, each clip's length (int64)."""

    spec: WaveformSpec | None = None
    n: int = 0
    channels: int = 1
    mono: bool = True  # 1-D clips: the output has no channel axis
    lens: torch.Tensor | None = None  # (n,) int64 on the host, where it crosses
    clips: list | None = None  # ragged clips, as given

    what = "audio"

    @functools.cached_property
    def nbytes(self) -> int:
        return self.cut + (0 if self.lens is None else 8 * self.n)

    @property
    def cut(self) -> int:
        """Where the samples end in its bytes (the lengths follow)."""
        return math.prod(self.shape) * self.dtype.itemsize

    usual_bytes = cut  # the samples as they arrived (batch.to(device)'s; a ragged list's too)

    def pack(self, dst: torch.Tensor, value: Any) -> None:
        """The samples, then the lengths (their bytes: ``dst`` may not be 8-aligned there)."""
        cut = self.cut
        if self.clips is None:
            super().pack(dst[:cut], value)
        else:
            out = dst[:cut].numpy().view(numpy_dtype(self.dtype))
            np.concatenate([c.reshape(-1).numpy() for c in self.clips], out=out, casting="unsafe")
        if self.lens is not None:
            dst[cut:].copy_(self.lens.view(torch.uint8))

    def view(self, raw: torch.Tensor, device: torch.device) -> tuple:
        """``(samples, lengths or None)`` on the device."""
        cut = self.cut
        lens = None if self.lens is None else raw[cut:].clone().view(torch.int64)  # aligned
        return raw[:cut].view(self.dtype).view(self.shape), lens

    def finish(self, x: tuple, ctx: Context) -> torch.Tensor | Padded:
        """Float clips ``(N, [C,] length)`` (or their mel ``(N, [C,] n_mels, frames)``):
        cropped where longer (the crop's offset drawn first), padded with zeros where shorter,
        scaled to [-1, 1], then a gain drawn in dB and clamped to [-1, 1] (torchaudio's Vol)."""
        g = ctx.generator
        wave, kept = self.cropped(*x, g)  # x: (samples, lengths or None)
        spec = self.spec
        if spec.gain is not None:
            low, high = spec.gain
            db = torch.rand(self.n, generator=g, device=wave.device) * (high - low) + low
            wave = (wave * 10 ** (db / 20)[:, None, None]).clamp(-1, 1)
        if spec.mel is not None:
            wave, kept = spec.mel(wave), spec.mel.frames(kept)
        wave = wave[:, 0] if self.mono else wave
        return Padded(wave, kept) if spec.pad else wave

    def cropped(self, samples: torch.Tensor, lens, g) -> tuple[torch.Tensor, torch.Tensor]:
        """``(N, C, length)`` float clips and the samples kept of each (int64 ``(N,)``)."""
        spec, dev, n, c = self.spec, samples.device, self.n, self.channels
        width = samples.shape[-1]
        lens = torch.full((n,), width, device=dev) if lens is None else lens  # full rows
        kept = lens.clamp(max=spec.length)
        spare = lens - kept
        if spec.crop == "random":  # drawn where nothing is cropped too: the gain's draw follows
            u = torch.rand(n, generator=g, device=dev, dtype=torch.float64)
            start = torch.minimum((u * (spare + 1)).long(), spare)
        else:
            start = spare // 2 if spec.crop == "centre" else torch.zeros_like(spare)
        t = torch.arange(spec.length, device=dev)
        inside = t < kept[:, None, None]  # (N, 1, length)
        if self.clips is None and width <= spec.length:  # rows: nothing to crop, one pad
            wave = F.pad(scaled(samples.view(n, c, width)), (0, spec.length - width))
            return (wave if self.lens is None else wave.masked_fill(~inside, 0)), kept
        stride = lens if self.clips is not None else torch.full_like(lens, width)  # per channel
        base = torch.cumsum(stride * c, 0) - stride * c  # clip k starts where clip k - 1 ends
        rows = torch.arange(c, device=dev)[:, None] * stride[:, None, None]  # (N, C, 1)
        index = (base + start)[:, None, None] + rows + t  # (N, C, length) into the samples
        flat = samples.reshape(-1) if samples.numel() else samples.new_zeros(1)
        return scaled(flat[torch.where(inside, index, 0)]).masked_fill(~inside, 0), kept


def scaled(x: torch.Tensor) -> torch.Tensor:
    """Integer samples as float32 in [-1, 1), as ``torchaudio.load`` (and TorchCodec's
    ``AudioDecoder``) scales them: signed ones / 2**(bits - 1), uint8 (8-bit WAV)
    (x - 128) / 128."""
    if x.dtype == torch.uint8:
        return (x.float() - 128) / 128
    return x.float() / 2.0 ** (8 * x.dtype.itemsize - 1)


def waveform(
    length: int,
    *,
    dtype: torch.dtype = torch.int16,
    crop: str = "random",
    pad: bool = False,
    gain: tuple[float, float] | None = None,
    mel: bool | dict | None = None,
    lengths: Name | None = None,
) -> WaveformSpec:
    """Declare a waveform field for ``wrap(fields={name: latecast.waveform(...)})``.

    Args:
        length: the samples each clip comes out with (16000: 1 s at 16 kHz).
        dtype: the integer width the samples are stored in and cross in: int16 (PCM-16, / 32768
            on the device), int32 (/ 2**31), int8, uint8 (8-bit WAV, (x - 128) / 128).
            Waveforms of another integer dtype must fit it (a BatchError otherwise); float
            samples are a BatchError: read them as stored, ``soundfile.read(path,
            dtype="int16")`` or ``wave``'s ``np.frombuffer(w.readframes(n), np.int16)``
            (``torchaudio.load(normalize=False)`` gives float32 since torchaudio 2.9).
        crop: where a longer clip is cropped: ``"random"`` (per clip, drawn from the batch's
            seeded generator), ``"centre"`` or ``"start"``.
        pad: pad shorter clips with zeros at the end; the field then comes out as
            ``Padded(audio, lengths)``, ``lengths`` in samples (mel frames with ``mel``). Without
            it a shorter clip is a BatchError.
        gain: ``(low, high)`` dB, a gain drawn per clip, then clamped to [-1, 1] (torchaudio's
            ``Vol(gain, "db")``); None: none.
        mel: a log-mel spectrogram on the device: True, or a dict of ``MelSpectrogram``'s
            options (sample_rate, n_fft, win_length, hop_length, f_min, f_max, n_mels, power,
            center, pad_mode) and ``log`` ("db", "log" or None), ``top_db``, ``eps``.
        lengths: the batch field holding each clip's length when clips come padded.

    Example:
        >>> dl = DataLoader(clips, 256, collate_fn=lambda b: ([w for w, _ in b], ...))
        >>> loader = latecast.wrap(dl, fields={0: latecast.waveform(16000, pad=True, mel=True)})
        >>> (mel, frames), labels = next(iter(loader))  # (256, 128, 81) float32 dB
    """
    length = check(length, "latecast.waveform(length=...)", int, 1)
    crop = check(crop, "latecast.waveform(crop=...)", CROPS)
    pad = check(pad, "latecast.waveform(pad=...)", bool)
    pair = isinstance(gain, (tuple, list)) and len(gain) == 2
    pair = pair and all(isinstance(v, (int, float)) and math.isfinite(v) for v in gain)
    refuse(
        [
            (any(dtype is d for d in WIDTHS), "latecast.waveform(dtype=...)", dtype,
             ", ".join(map(str, WIDTHS))),
            (gain is None or (pair and gain[0] <= gain[1]), "latecast.waveform(gain=...)", gain,
             "(low, high) dB, low <= high, or None"),
            (mel is None or isinstance(mel, (bool, dict)), "latecast.waveform(mel=...)", mel,
             "True, a dict of MelSpectrogram's options, or None"),
        ]
    )  # fmt: skip
    options = {} if mel is True else mel if isinstance(mel, dict) else None
    gain = None if gain is None else (float(gain[0]), float(gain[1]))
    return WaveformSpec(length, dtype, crop, pad, gain, _mel(options, length), lengths)


_CHOICES = {"pad_mode": ("reflect", "constant", "replicate", "circular")}
_CHOICES["log"] = ("db", "log", None)
_OPTIONAL = {"win_length": int, "hop_length": int, "f_max": float, "top_db": float}


def _mel(options: dict | None, length: int) -> Mel | None:
    """A ``Mel`` of ``options``, each checked (one ConfigError naming it)."""
    if options is None:
        return None
    say, known = "latecast.waveform(mel=...)", {f.name: f.default for f in dataclasses.fields(Mel)}
    for key, value in options.items():
        if key not in known:
            raise ConfigError(f"{say}: unknown option {key!r}; the options: {', '.join(known)}")
        kind = _CHOICES.get(key) or _OPTIONAL.get(key) or type(known[key])
        if value is not None or known[key] is not None:
            check(value, f"{say}[{key!r}]", kind, *{int: (1,), float: (0,)}.get(kind, ()))
    m = Mel(**options)
    top, least = m.sample_rate / 2 if m.f_max is None else m.f_max, m.n_fft // 2 + 1
    refuse(
        [
            ((m.win_length or 0) <= m.n_fft, f"{say}['win_length']", m.win_length,
             f"at most n_fft ({m.n_fft})"),
            (m.f_min < top <= m.sample_rate / 2, f"{say}['f_max']", m.f_max,
             f"above f_min ({m.f_min}), at most sample_rate / 2"),
            (m.power > 0 and m.eps > 0, f"{say}['power'] and ['eps']", (m.power, m.eps),
             "above 0"),
            (length >= least or not m.center, "latecast.waveform(length=...)", length,
             f"at least n_fft // 2 + 1 ({least}) for a centred mel"),
        ]
    )  # fmt: skip
    return m
