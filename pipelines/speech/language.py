"""Choosing a transcription model that understands the language spoken.

The default model, whisper tiny.en, is English-only: given German it writes fluent English
nonsense. Before the model loads, the runner asks ``advise`` (through
TranscribePipeline.advise_model) for a second look at the job:

- ``--language en``: nothing to check. Another ``--language``, or ``--task translate``, with the
  English-only default: the job runs on the multilingual default (``transcribe:multilingual`` in
  configs/models.toml, whisper-base) with no detection needed.
- no ``--language``: the multilingual model's language detector hears the first speech of the
  first file (up to DETECT_S seconds found by VAD; Whisper's encoder runs on just those frames,
  not a padded 30 s window, which makes it ~4x cheaper and was as sure on the samples; the first
  QUICK_S seconds first, which settle a clear English at half the cost). Not English
  (p >= MIN_PROB): the default switches to the multilingual model; an English-only model the user
  named stays, with a warning naming the multilingual alias.

The detector is the multilingual model itself on CTranslate2 in int8 (measured on 2 cores: load
0.43 s and 0.3 s to detect on 8 s of speech, against 0.50 s and 0.53 s for float32 on 10 s; the
same language and probability to 3 digits), kept in the engine cache so a server or batch loads it
once. Without CTranslate2 or the multilingual model nothing is detected and the job runs as asked.
A batch is decided by its first file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from taskrun.models.resolve import default_model, resolve
from taskrun.pipelines.speech import audio
from taskrun.tasks.base import Input, ModelCard, TaskError

# Seconds of speech the detector hears. 4 s halves the detection (0.089 against 0.180 s on the
# meeting) and named every sample alike, but the German sample is only sure from 4 s (3 s: de
# p=0.37, below MIN_PROB; 2 s: en): 8 s keeps a margin for a greeting or a name at the start.
DETECT_S = 8.0
# English is heard first on the first QUICK_S seconds: where the detector is that sure of it
# (p >= SURE_EN), the job goes on as asked without the full DETECT_S pass. On every English sample
# the project has, 4 s gave en at p >= 0.99 (the meeting, the LibriVox sentences; 91 against
# 201 ms on the meeting); anything else (another language, an unsure English, a short clip) is
# heard again on the whole DETECT_S, so the switch is decided exactly as before.
QUICK_S = 4.0
SURE_EN = 0.95
DETECTOR_DTYPE = "int8"  # loads and runs faster than float32 and needs a quarter of the memory
LOOK_S = 60.0  # how far into the file to look for that much speech
MIN_PROB = 0.5  # below this the detector is not sure: keep the model asked for
ENGLISH_ONLY_VOCAB = 51864  # openai/whisper: is_multilingual = n_vocab >= 51865
NAMES = {
    "de": "German",
    "fr": "French",
    "es": "Spanish",
    "it": "Italian",
    "pt": "Portuguese",
    "nl": "Dutch",
    "pl": "Polish",
    "ru": "Russian",
    "uk": "Ukrainian",
    "tr": "Turkish",
    "ar": "Arabic",
    "zh": "Chinese",
    "ja": "Japanese",
    "ko": "Korean",
    "hi": "Hindi",
    "sv": "Swedish",
    "da": "Danish",
    "no": "Norwegian",
    "fi": "Finnish",
    "cs": "Czech",
}


def english_only(card: ModelCard) -> bool:
    """Whether a Whisper model knows English only, read from its vocabulary size (no weights);
    remembered per folder and file time (counting tiny.en's 51,864 lines took 14 ms a job)."""
    folder = Path(card.path)
    try:
        stamp = max((folder / n).stat().st_mtime_ns for n in VOCAB_FILES if (folder / n).exists())
    except (OSError, ValueError):  # no vocabulary file: max() of nothing
        stamp = 0
    return _english_only(card.architecture, str(folder), stamp)


VOCAB_FILES = ("vocabulary.txt", "vocabulary.json", "config.json")


@lru_cache(maxsize=32)
def _english_only(architecture: str, path: str, stamp: int) -> bool:
    folder = Path(path)
    try:
        if architecture == "WhisperCT2":
            if (folder / "vocabulary.txt").exists():
                with open(folder / "vocabulary.txt", encoding="utf-8") as f:
                    return sum(1 for _ in f) == ENGLISH_ONLY_VOCAB
            return len(json.loads((folder / "vocabulary.json").read_text())) == ENGLISH_ONLY_VOCAB
        if architecture == "WhisperForConditionalGeneration":
            return json.loads((folder / "config.json").read_text()).get("vocab_size") == ENGLISH_ONLY_VOCAB
    except (OSError, ValueError):
        pass
    return False


def multilingual_alias() -> str | None:
    try:
        return default_model("transcribe", "multilingual")
    except TaskError:
        return None


def advise(
    card: ModelCard,
    inputs: list[Input],
    options: Any,
    *,
    chosen: bool,
    device: str,
    offline: bool,
    runtime: str | None = None,
    dtype: str = "auto",
    **_,
) -> tuple[ModelCard, list[str]]:
    """(the card to run, notices) for a transcribe job about to load ``card``; ``chosen`` is True
    when the user named the model."""
    if options.language == "en" or not english_only(card):
        return card, []
    alias = multilingual_alias()
    if alias is None:
        return card, []
    if options.language is not None or options.task == "translate":
        if chosen:  # the pipeline's option check refuses this and names the multilingual model
            return card, []
        why = f"--language {options.language}" if options.language else "--task translate"
        return _switch(card, alias, offline, f"{why}: `{card.name}` is English-only, so this job runs on {alias}")
    heard = detect(inputs, alias, device, offline, meanwhile=lambda: _warm(card, runtime, device, dtype))
    if heard is None:
        return card, []
    path, lang, prob = heard
    said = f"{path} sounds like {NAMES.get(lang, lang)} ({lang}, p={prob:.2f})"
    if chosen:
        return card, [
            f"{said}, but `{card.name}` is English-only: its transcript will not be that "
            f"language; use --model {alias} (or --language en to skip this check)"
        ]
    return _switch(
        card,
        alias,
        offline,
        f"{said}; `{card.name}` is English-only, so this job runs on "
        f"{alias} (--model picks one, --language en skips this check)",
    )


def _switch(card: ModelCard, alias: str, offline: bool, note: str) -> tuple[ModelCard, list[str]]:
    try:
        return resolve(alias, offline=offline), [note]
    except TaskError:  # not installed: run as asked; the option check says what to install
        return card, []


def detect(
    inputs: list[Input], alias: str, device: str, offline: bool, meanwhile: Callable[[], Any] | None = None
) -> tuple[str, str, float] | None:
    """(file, language code, probability) of the first speech of the first readable file, when
    it is not English and the detector is sure; None otherwise (or when it cannot run).

    The detector loads on a thread of its own while this one reads the first speech: CTranslate2
    reads and converts the weights with the GIL released, so a cold `run transcribe` pays the
    longer of the two (~0.4 s), not their sum (~0.65 s). ``meanwhile`` then runs on that thread
    while the detector listens (_warm: the model asked for loads, ~0.25 s cold)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="taskrun-detector") as pool:
        loading = pool.submit(_detector, alias, device, offline)
        speech = None
        for inp in inputs:
            try:
                speech = first_speech(inp.path) if inp.path else None
            except TaskError:  # an unreadable file: the pipeline reports it; try the next
                continue
            if speech is not None:
                break
        engine = loading.result()
        if speech is None or engine is None:
            return None
        if meanwhile is not None:
            pool.submit(meanwhile)
        lang, prob = engine.detect_language(speech[: int(QUICK_S * 16000)])
        if len(speech) > QUICK_S * 16000 and not (lang == "en" and prob >= SURE_EN):
            lang, prob = engine.detect_language(speech)
    return (inp.path, lang, prob) if lang != "en" and prob >= MIN_PROB else None


def _warm(card: ModelCard, runtime: str | None, device: str, dtype: str) -> None:
    """Load the transcription model the job asked for into the model cache, as the runner is
    about to (the same key: it then finds it loaded, or waits for this load). Wasted only where
    the speech turns out not to be English; a failure is left for the runner's own load to report."""
    from taskrun.pipelines import load_pipeline

    try:
        load_pipeline("transcribe", card, runtime or card.runtime, device, dtype)
    except Exception:
        pass


def _detector(alias: str, device: str, offline: bool):
    """The language detector (the multilingual model in int8 on CTranslate2), or None where it
    cannot load."""
    try:
        from taskrun.pipelines import cached_model
        from taskrun.pipelines.speech.ct2_engine import CT2WhisperEngine

        card, dev = resolve(alias, offline=offline), _ct2_device(device)
        # One thread: a second CTranslate2 model that ran on two threads in this process made the
        # English model's decoding ~2x slower for the rest of the process (generate 1.9-2.2 s
        # against 1.1-1.3 s on the meeting, reproduced with faster-whisper alone); on one
        # thread it does not. Still so with CT2_SPINCOUNT (device.py), and this is why: its team
        # thread makes libgomp manage more threads than there are cores, and libgomp then waits
        # with its "throttled" spin count, which is 0 under OMP_WAIT_POLICY=PASSIVE: passive waits
        # for the rest of the process. Whole warm job on the meeting, 2 cores, a fresh process
        # each: 1.99-2.11 s on one thread, 2.57-2.69 s on two (the detection itself only 0.015 s
        # faster), 1.66-1.70 s with --language en; a language=en job after one two-thread
        # detection 2.25-2.31 s, the same as passive waits (2.41 s). Its own cache role, so it
        # never stands in for a transcribing engine.
        return cached_model(
            card,
            CT2WhisperEngine.runtime,
            dev,
            DETECTOR_DTYPE,
            "language-detector",
            lambda: CT2WhisperEngine(card, dev, DETECTOR_DTYPE, threads=1),
        )
    except (TaskError, ImportError):
        return None


def _ct2_device(device: str) -> str:
    return device if device in ("auto", "cpu") or device.startswith("cuda") else "cpu"


def first_speech(path: str, sr: int = 16000) -> np.ndarray | None:
    """Up to DETECT_S seconds of speech (Silero VAD) from the first LOOK_S seconds of ``path``."""
    got, have = [], 0
    for chunk in audio.chunked(_head_blocks(path, sr), sr, 30.0, 8.0):
        x = chunk.samples
        if audio.is_silent(x):
            continue
        for a, b in audio.speech_spans(x, sr):
            got.append(x[a:b])
            have += b - a
        if have >= DETECT_S * sr:
            break
    return np.concatenate(got)[: int(DETECT_S * sr)] if have >= 0.5 * sr else None


def _head_blocks(path: str, sr: int):
    read = 0
    for block in audio.read_blocks(path, sr):
        yield block
        read += len(block)
        if read >= LOOK_S * sr:
            return
