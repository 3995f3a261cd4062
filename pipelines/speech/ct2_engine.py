"""transcribe on CTranslate2 through faster-whisper: the default for the packaged Whisper weights.

taskrun does the reading, chunking and voice-activity detection (pipelines/speech/transcribe.py) so that
both runtimes see the same chunks. This engine is handed up to two minutes of packed speech at a
time (``seek_window_s``) and lets faster-whisper's loop walk it in 30 s windows, each prompted
with the tokens before it: greedy decoding then keeps the context that fixed 30 s cuts lose.
"""

from __future__ import annotations

from pathlib import Path

from taskrun.pipelines.device import cpu_threads, ct2_wait_note, import_ctranslate2
from taskrun.pipelines.speech.engine import FileState, Piece, SpeechEngine
from taskrun.tasks.base import TaskError

# CTranslate2's own libgomp reads its wait policy once, when ctranslate2 is first imported: through
# import_ctranslate2 (device.py), which sets the runner's policy for it, without importing torch.

# float32 on CPU: the packaged weights are fp16, and CTranslate2 converts them at load; int8 costs
# ~1.6 s more load for tiny.en and decoded no faster here (see benchmarks/bench_transcribe.py).
_CPU_DTYPE = "float32"


def ct2_device(device: str) -> str:
    ctranslate2 = import_ctranslate2()

    if device in ("auto", "", None):
        return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
    if device.startswith("cuda"):
        if ctranslate2.get_cuda_device_count() == 0:
            raise TaskError(f"--device {device} asked for, but CTranslate2 sees no CUDA device; use --device cpu")
        return device
    if device == "cpu":
        return device
    raise TaskError(
        f"the ctranslate2 runtime runs on cpu or cuda, not {device}; use --runtime transformers for other devices"
    )


def compute_type(dtype: str, device: str, settings: dict) -> str:
    if dtype in ("auto", "", None):
        return settings.get("compute_type") or ("float16" if device.startswith("cuda") else _CPU_DTYPE)
    if dtype == "float16" and device == "cpu":
        raise TaskError("float16 is not supported on CPU by CTranslate2; use --dtype float32 or bfloat16")
    return dtype


def generation_limit(folder) -> int | None:
    """New tokens per window when the folder's generation_config.json caps them below Whisper's
    448 (a converted folder may carry one); None keeps faster-whisper's limit."""
    import json

    try:
        limit = json.loads((folder / "generation_config.json").read_text()).get("max_length")
    except (OSError, ValueError):
        return None
    return max(1, int(limit) - 4) if limit and int(limit) < 448 else None  # 4: the prompt tokens


class CT2WhisperEngine(SpeechEngine):
    """Whisper in a CTranslate2 folder (model.bin), decoded by faster-whisper."""

    runtime = "ctranslate2"
    batch_windows = 64  # the most windows --batch-size may put in one batch (pipelines/speech/ct2_batch.py)
    # faster-whisper's loop walks a long stretch of packed speech in --chunk-s windows, each
    # started at the last timestamp before it and prompted with the tokens decoded so far: greedy
    # decoding then keeps its context across windows (pipelines/speech/transcribe.py packs for it).
    # Memory grows with it: faster-whisper's STFT of the whole stretch peaks at ~1 MB per second
    # of speech (118 MB for 120 s, 294 MB for 300 s; the samples are 7.7 MB, the log-Mel 3.7 MB).
    # 120 s gave the meeting x3 and meeting.wav the same text as 300 s, and a 1-hour file 734-755 MB
    # peak RSS instead of 844 MB (benchmarks/README.md, "Transcribe: ... one stretch").
    # Each stretch after the first starts prompted with the text before it, not with tokens and
    # their timestamps: tiny.en then often stops timing inside a 30 s window (one segment each).
    seek_window_s = 120.0

    def __init__(self, card, device="auto", dtype="auto", threads: int | None = None):
        if not (Path(card.path) / "model.bin").exists():
            raise TaskError(
                f"`{card.name}` is not a CTranslate2 folder (no model.bin); run it with --runtime transformers"
            )
        self.card = card
        self.threads = threads  # None: every core (cpu_threads)
        self.device = ct2_device(device)
        self.dtype = compute_type(dtype, self.device, card.extra)
        self.model = self._load()
        note = ct2_wait_note() if self.device == "cpu" else None
        if note and note not in card.extra.get("ran", ()):  # chosen for the whole process as
            card.extra["ran"] = [*card.extra.get("ran", ()), note]  # CTranslate2 loaded; it moves speed 1.3x
        self.max_new_tokens = generation_limit(Path(card.path))
        self._batch = None

    def _load(self):
        import_ctranslate2()  # before faster_whisper imports it: the wait policy is read then
        from faster_whisper import WhisperModel

        dev, _, index = self.device.partition(":")
        try:
            return WhisperModel(
                self.card.path,
                device=dev,
                device_index=int(index or 0),
                compute_type=self.dtype,
                cpu_threads=(self.threads or cpu_threads()) if dev == "cpu" else 0,
                local_files_only=True,
            )
        except (RuntimeError, ValueError) as exc:
            raise TaskError(
                f"CTranslate2 could not load {self.card.path} ({exc}); the folder is "
                f"incomplete or from another CTranslate2 version"
            ) from None

    @property
    def multilingual(self) -> bool:
        return bool(self.model.model.is_multilingual)

    def languages(self) -> list[str]:
        return list(self.model.supported_languages)

    def decode(self, samples, options, state: FileState):
        import ctranslate2

        ctranslate2.set_random_seed(0)  # a temperature fallback samples: the same audio gives the same text
        language = state.language or (None if self.multilingual else "en")
        segments, info = self.model.transcribe(
            samples,
            language=language,
            task=options.task,
            beam_size=options.beam_size or 1,
            vad_filter=False,  # taskrun's own VAD already trimmed this window
            word_timestamps=options.word_timestamps,
            without_timestamps=False,
            condition_on_previous_text=True,
            max_new_tokens=self.max_new_tokens,
            # each inner window's length; given every call, since faster-whisper keeps the last one
            chunk_length=max(1, int(options.chunk_s)),
            # The previous window's words, so that each window continues the file's text the way
            # faster-whisper's own loop conditions on what it decoded before.
            initial_prompt=state.previous.strip() or None,
        )
        if state.language is None:  # detected once per file, then kept for every window
            state.language = info.language
        for s in segments:
            words = [(w.start, w.end, w.word.strip(), w.probability) for w in s.words] if s.words else None
            yield Piece(s.start, s.end, s.text, words)

    def decode_batch(self, windows, options, state: FileState):
        """Consecutive windows of one file: the first alone, prompted with the text before it
        (``state.previous``), the rest as one unprompted batch (pipelines/speech/ct2_batch.py).
        A window that fails Whisper's checks in the batch is decoded again alone, with the
        sequential decoder's temperature fallback."""
        from taskrun.pipelines.speech.ct2_batch import BatchDecoder

        if self._batch is None:
            self._batch = BatchDecoder(self.model, self.max_new_tokens)
        first = [list(self.decode(windows[0], options, state))] if state.previous.strip() else []
        windows = windows[len(first) :]
        if not windows:
            return first
        language = state.language or (None if self.multilingual else "en")
        state.language, batch = self._batch.decode(windows, options, language)
        out = first
        for pieces, samples in zip(batch, windows):
            if pieces is None:
                out.append(list(self.decode(samples, options, state)))
            else:
                out.append(pieces + self._tail(samples, pieces, options, state))
        return out

    def detect_language(self, samples) -> tuple[str, float]:
        """(language code, probability) of ``samples`` (16 kHz mono), from Whisper's language
        token after one encoder pass. The encoder hears just these frames, not a window padded to
        30 s: a few seconds of speech cost a quarter of the padded pass and named the language as
        surely on the samples tried (pipelines/speech/language.py)."""
        if not self.multilingual:
            raise TaskError(f"`{self.card.name}` is English-only and has no language detector")
        frames = max(1, len(samples) // self.model.feature_extractor.hop_length)
        features = self.model.feature_extractor(samples)[:, :frames]
        (ranked,) = self.model.model.detect_language(self.model.encode(features))
        token, prob = ranked[0]
        return token.strip("<|>"), float(prob)
