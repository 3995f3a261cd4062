"""Several windows of one file decoded as one batch on CTranslate2, the way faster-whisper's
``BatchedInferencePipeline`` does: one encoder pass over the stacked windows, one ``generate``
call for all of them, and (with --word-timestamps) one alignment pass.

On a CPU the batch shares each decoder step's fixed cost among the windows, so long audio
decodes faster than window after window (benchmarks/bench_transcribe.py). What differs from
faster-whisper's batched mode, on purpose:

- the first window whose previous text is known is decoded alone, prompted with that text as the
  sequential decoder prompts every window (CTranslate2 needs the same prompt length across a
  batch); the batch after it is unprompted, as in faster-whisper's batched mode, because the text
  just before each of its windows is decoded in the same batch. A batch prompted with older text
  instead continues from that text and skips what it hears first (measured: 28% WER on three
  copies of the meeting recording in a row, against 5% unprompted);
- text after the window's last timestamp is kept as a piece running to the window's end (the
  batched mode drops it; the sequential mode decodes it again from there);
- a window whose output fails Whisper's checks (too repetitive, or too unlikely) is decoded again
  alone by the sequential path, with its temperature fallback: a batch never lowers quality below
  the sequential decoder's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from taskrun.pipelines.speech.engine import Piece

TIME_PRECISION = 0.02  # seconds per Whisper timestamp token
FRAMES_PER_S = 100  # mel frames per second of audio
MAX_INITIAL_TIMESTAMP = 1.0  # faster-whisper's: the first segment starts within 1 s
# Whisper's quality checks, as faster-whisper's sequential decoder applies them
COMPRESSION_RATIO_MAX = 2.4
LOGPROB_MIN = -1.0
NO_SPEECH_MIN = 0.6
PREPEND = "\"'“¿([{-"
APPEND = "\"'.。,，!！?？:：”)]}、"


def split_tokens(tokens: list[int], ts_begin: int, eot: int, duration: float) -> list[dict]:
    """A window's output tokens → segments {start, end, tokens, seek}: timestamps come in pairs
    around each segment's text; text after the last one runs to the window's end (``duration``)."""
    segs: list[dict] = []
    text: list[int] = []
    start = last = 0.0
    opened = False
    for t in tokens:
        if t >= ts_begin:
            time = (t - ts_begin) * TIME_PRECISION
            if text:
                segs.append({"start": start if opened else last, "end": time, "tokens": text, "seek": 0})
                text, opened, last = [], False, time
            else:
                start, opened = time, True
        elif t < eot:
            text.append(t)
    if text:
        segs.append({"start": start if opened else last, "end": duration, "tokens": text, "seek": 0})
    return segs


class BatchDecoder:
    """faster-whisper's WhisperModel driven a batch at a time (its own helpers for features,
    prompts, alignment and suppressed tokens, so the decoding matches its sequential mode)."""

    def __init__(self, whisper_model, max_new_tokens: int | None) -> None:
        self.wm = whisper_model
        self.max_new_tokens = max_new_tokens

    def tokenizer(self, language: str, task: str):
        from faster_whisper.tokenizer import Tokenizer

        return Tokenizer(self.wm.hf_tokenizer, self.wm.model.is_multilingual, task=task, language=language)

    def encode(self, windows: list[np.ndarray]):
        from faster_whisper.audio import pad_or_trim

        feats = np.stack([pad_or_trim(self.wm.feature_extractor(w)[..., :-1]) for w in windows])
        return self.wm.encode(feats)

    def detect_language(self, encoder_output) -> str:
        """The first window's language (Whisper's language token), kept for the whole file."""
        ranked = self.wm.model.detect_language(encoder_output)[0]
        return ranked[0][0].strip("<|>")

    def generate(self, encoder_output, n: int, tok, options: Any) -> list[dict]:
        """One generate call for ``n`` windows, none prompted (the text just before each is being
        decoded in the same batch; CTranslate2 also needs every prompt the same length). Each
        result's tokens, average log-probability, no-speech probability and compression ratio."""
        from faster_whisper.transcribe import get_compression_ratio, get_suppressed_tokens

        prompt = self.wm.get_prompt(tok, [])
        limit = len(prompt) + self.max_new_tokens if self.max_new_tokens else self.wm.max_length
        results = self.wm.model.generate(
            encoder_output,
            [list(prompt) for _ in range(n)],
            beam_size=options.beam_size or 1,
            max_length=min(limit, self.wm.max_length),
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=list(get_suppressed_tokens(tok, [-1])),
            max_initial_timestamp_index=int(round(MAX_INITIAL_TIMESTAMP / TIME_PRECISION)),
        )
        out = []
        for r in results:
            tokens = r.sequences_ids[0]
            avg = r.scores[0] * len(tokens) / (len(tokens) + 1)
            text = tok.decode([t for t in tokens if t < tok.eot]).strip()
            out.append(
                {
                    "tokens": tokens,
                    "avg_logprob": avg,
                    "no_speech_prob": r.no_speech_prob,
                    "compression_ratio": get_compression_ratio(text) if text else 0.0,
                }
            )
        return out

    @staticmethod
    def verdict(result: dict) -> str:
        """'skip' (silence: Whisper's no-speech rule), 'retry' (fails the quality checks: decode
        alone with the temperature fallback) or 'ok'."""
        if result["no_speech_prob"] > NO_SPEECH_MIN and result["avg_logprob"] < LOGPROB_MIN:
            return "skip"
        if result["compression_ratio"] > COMPRESSION_RATIO_MAX or result["avg_logprob"] < LOGPROB_MIN:
            return "retry"
        return "ok"

    def words(self, segmented: list[list[dict]], tok, encoder_output, windows: list[np.ndarray]) -> None:
        """Word times for every window's segments, from one alignment pass over the batch
        (faster-whisper's add_word_timestamps; sets each segment's "words")."""
        sr = self.wm.feature_extractor.sampling_rate
        sizes = [int(np.ceil(len(w) / sr) * FRAMES_PER_S) for w in windows]
        # a window without text still takes its place in the batch (the encoder output is
        # batched): an empty segment aligns to no words
        padded = [segs or [{"start": 0.0, "end": 0.0, "tokens": [], "seek": 0}] for segs in segmented]
        self.wm.add_word_timestamps(padded, tok, encoder_output, sizes, PREPEND, APPEND, 0.0)

    def decode(
        self, windows: list[np.ndarray], options: Any, language: str | None
    ) -> tuple[str, list[list[Piece] | None]]:
        """(language, pieces per window); None for a window the caller must decode alone."""
        encoder_output = self.encode(windows)
        if language is None:
            language = self.detect_language(encoder_output)
        tok = self.tokenizer(language, options.task)
        results = self.generate(encoder_output, len(windows), tok, options)
        verdicts = [self.verdict(r) for r in results]
        sr = self.wm.feature_extractor.sampling_rate
        segmented = [
            split_tokens(r["tokens"], tok.timestamp_begin, tok.eot, len(w) / sr) if v == "ok" else []
            for r, v, w in zip(results, verdicts, windows)
        ]
        if options.word_timestamps and any(segmented):
            self.words(segmented, tok, encoder_output, windows)
        pieces: list[list[Piece] | None] = []
        for segs, v in zip(segmented, verdicts):
            if v == "retry":
                pieces.append(None)
                continue
            pieces.append(
                [
                    Piece(
                        float(s["start"]),
                        float(s["end"]),
                        tok.decode(s["tokens"]),
                        [
                            (float(w["start"]), float(w["end"]), w["word"].strip(), float(w["probability"]))
                            for w in s.get("words", [])
                        ]
                        if options.word_timestamps
                        else None,
                    )
                    for s in segs
                ]
            )
        return language, pieces
