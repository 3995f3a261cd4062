"""Speaker embeddings: the interface diarization drives (``SpeakerEngine.embed(windows)``), and the
GE2E encoder shipped in Resemblyzer's wheel as its first engine.

The package itself is never imported (it needs librosa and webrtcvad): its ``pretrained.pt`` is
read with ``torch.load(weights_only=True)`` and the network rebuilt here, LSTM(40, 256, 3) →
Linear(256) → ReLU → L2 norm, fed a 40-bin mel *power* spectrogram (25 ms window, 10 ms hop,
16 kHz) in 160-frame partials whose embeddings are averaged, as Resemblyzer's
``embed_utterance`` does. Another embedding model (pyannote, ECAPA) is one more subclass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from taskrun.pipelines import cached_model
from taskrun.tasks.base import ModelCard, TaskError

SR = 16000
N_FFT, HOP, N_MELS = 400, 160, 40  # 25 ms, 10 ms at 16 kHz; Resemblyzer's hparams
PARTIAL = 160  # frames per partial utterance (1.6 s)
TARGET_DBFS = -30.0  # Resemblyzer raises quiet audio to this level before the spectrogram


class SpeakerEngine(ABC):
    """A voice-embedding model: windows of 16 kHz mono float32 → one unit vector each."""

    runtime: str = ""
    card: ModelCard
    dim: int = 0

    @abstractmethod
    def __init__(self, card: ModelCard, device: str, dtype: str) -> None: ...

    @classmethod
    def load(cls, card: ModelCard, device: str = "cpu", dtype: str = "float32") -> SpeakerEngine:
        return cached_model(card, cls.runtime, device, dtype, "speaker-engine", lambda: cls(card, device, dtype))

    @abstractmethod
    def embed(self, windows: list[np.ndarray]) -> np.ndarray:
        """(len(windows), dim) float32, each row L2-normalised."""


_MEL: np.ndarray | None = None


def mel_filters() -> np.ndarray:
    """(201, 40) Slaney mel filters, 0–8 kHz: librosa's defaults, which Resemblyzer used."""
    global _MEL
    if _MEL is None:
        from transformers.audio_utils import mel_filter_bank

        _MEL = mel_filter_bank(
            num_frequency_bins=N_FFT // 2 + 1,
            num_mel_filters=N_MELS,
            min_frequency=0.0,
            max_frequency=SR / 2,
            sampling_rate=SR,
            norm="slaney",
            mel_scale="slaney",
        ).astype(np.float32)
    return _MEL


def mel_power(x: np.ndarray) -> np.ndarray:
    """(frames, 40) mel power spectrogram, centred frames (librosa's center=True, zero padding)."""
    x = np.asarray(x, dtype=np.float32)
    rms = float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) if len(x) else 0.0
    if rms > 0:
        gain_db = TARGET_DBFS - 20 * np.log10(rms)
        if gain_db > 0:  # Resemblyzer's increase_only normalisation
            x = x * np.float32(10 ** (gain_db / 20))
    x = np.pad(x, N_FFT // 2)
    n = 1 + max(0, (len(x) - N_FFT) // HOP)
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP][:n]
    window = np.hanning(N_FFT + 1)[:-1].astype(np.float32)  # periodic Hann, as librosa
    spec = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    return (spec.astype(np.float32) @ mel_filters()).astype(np.float32)


def partials(n_frames: int, rate: float = 1.3, min_coverage: float = 0.75) -> list[slice]:
    """Resemblyzer's partial windows: 160 frames, ~1.3 per second's worth of step (50 % overlap
    at 16 kHz); a last partial that covers too little of its window is dropped."""
    step = max(1, int(np.round((SR / rate) / HOP / 1)))  # frames per step
    step = min(step, PARTIAL)
    out = []
    last = max(1, n_frames - PARTIAL + step)
    for start in range(0, last, step):
        out.append(slice(start, start + PARTIAL))
    if len(out) > 1 and (n_frames - out[-1].start) / PARTIAL < min_coverage:
        out.pop()
    return out


class GE2EEngine(SpeakerEngine):
    """Resemblyzer's GE2E encoder in plain torch, every partial of every window in one batch."""

    runtime = "torch"
    dim = 256

    def __init__(self, card: ModelCard, device: str = "cpu", dtype: str = "float32") -> None:
        import torch

        self.card, self.device, self.dtype = card, "cpu", "float32"
        try:
            state = torch.load(card.path, map_location="cpu", weights_only=True)["model_state"]
        except Exception as exc:  # a damaged or foreign file: name it
            raise TaskError(f"{card.path} is not a GE2E speaker model ({exc}); reinstall Resemblyzer==0.1.4") from exc
        state = {k: v for k, v in state.items() if not k.startswith("similarity_")}
        self._torch = torch
        self.lstm = torch.nn.LSTM(N_MELS, 256, 3, batch_first=True)
        self.linear = torch.nn.Linear(256, 256)
        self.lstm.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("lstm.")})
        self.linear.load_state_dict({k[7:]: v for k, v in state.items() if k.startswith("linear.")})
        self.lstm.eval()
        self.linear.eval()

    def _forward(self, mels: np.ndarray) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            _, (h, _) = self.lstm(torch.from_numpy(mels))
            e = torch.relu(self.linear(h[-1]))
            e = e / torch.linalg.norm(e, dim=1, keepdim=True).clamp_min(1e-9)
        return e.numpy()

    def embed(self, windows: list[np.ndarray]) -> np.ndarray:
        if not windows:
            return np.zeros((0, self.dim), np.float32)
        parts, owner = [], []
        for i, w in enumerate(windows):
            mel = mel_power(w)
            if len(mel) < PARTIAL:  # a short window is zero-padded, as Resemblyzer pads the wave
                mel = np.pad(mel, ((0, PARTIAL - len(mel)), (0, 0)))
            for s in partials(len(mel)):
                p = mel[s]
                if len(p) < PARTIAL:
                    p = np.pad(p, ((0, PARTIAL - len(p)), (0, 0)))
                parts.append(p)
                owner.append(i)
        out = np.zeros((len(windows), self.dim), np.float32)
        emb = np.concatenate([self._forward(np.stack(parts[k : k + 256])) for k in range(0, len(parts), 256)])
        np.add.at(out, np.array(owner), emb)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)
