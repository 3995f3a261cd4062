"""transcribe on transformers: Whisper (WhisperForConditionalGeneration) and CTC models
(wav2vec2-style *ForCTC) from Hugging Face folders or the hub.

A CTranslate2 Whisper folder (the packaged weights) is converted once into a transformers folder
in the cache (pipelines/speech/ct2_convert.py), keyed by the source digest, so the same weights run on
both runtimes. Chunking, VAD and timestamps are shared with the ctranslate2 runtime
(pipelines/speech/transcribe.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from taskrun.pipelines.device import auto_dtype, resolve_device, resolve_dtype, transpose_head
from taskrun.pipelines.speech.engine import FileState, Piece, SpeechEngine
from taskrun.tasks.base import TaskError

TIME_PRECISION = 0.02  # seconds per Whisper timestamp token
# Whisper's guards against repetition loops and invented text, as openai/whisper and faster-whisper
# use them (the compression ratio here is over token ids, hence 1.35 rather than 2.4): a window
# whose output is too repetitive or too unlikely is decoded again at a higher temperature.
FALLBACK = {
    "temperature": (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
    "compression_ratio_threshold": 1.35,
    "logprob_threshold": -1.0,
    "no_speech_threshold": 0.6,
}
CTC_GAP_S = 0.8  # a pause this long starts a new CTC segment
CTC_MAX_WORDS = 16


def model_folder(card) -> Path:
    if card.architecture == "WhisperCT2":
        from taskrun.models.resolve import cache_dir
        from taskrun.pipelines.speech.ct2_convert import converted_folder

        return converted_folder(card, cache_dir())
    return Path(card.path)


def whisper_segments(ids: list[int], ts_begin: int, eot: int, decode, times: list[float] | None = None) -> list[Piece]:
    """Whisper output tokens → pieces. Timestamps come in pairs around each segment's text
    (<|0.00|> text <|2.40|><|2.40|> text ...); a last segment without a closing timestamp
    runs to the end of the audio (end None). With ``times`` (each token's time, from
    ``return_token_timestamps``) each piece also gets its words."""
    pieces, text, start, last = [], [], None, 0.0
    for k, t in enumerate(ids):
        if t >= ts_begin:
            time = (t - ts_begin) * TIME_PRECISION
            if text:
                begin = last if start is None else start
                pieces.append(
                    Piece(
                        begin,
                        time,
                        decode([ids[i] for i in text]),
                        token_words(text, ids, times, decode, begin, time) if times else None,
                    )
                )
                text, start, last = [], None, time
            else:
                start = time
        elif t < eot:
            text.append(k)
    if text:
        begin = last if start is None else start
        pieces.append(
            Piece(
                begin,
                None,
                decode([ids[i] for i in text]),
                token_words(text, ids, times, decode, begin, None) if times else None,
            )
        )
    return pieces


def token_words(
    index: list[int], ids: list[int], times: list[float], decode, seg_start: float, seg_end: float | None
) -> list[tuple[float, float, str, None]]:
    """A segment's tokens (positions ``index`` in ``ids``) grouped into words, a word starting at a
    token that begins with a space. transformers times each token by where the cross-attention
    alignment leaves it (measured against faster-whisper's word times: ``times[k]`` is token k's
    end), so a word runs from the end of the token before it to the end of its last token."""
    groups: list[list[int]] = []
    for k in index:
        if not groups or decode([ids[k]]).startswith(" "):
            groups.append([k])
        else:
            groups[-1].append(k)
    words, hi = [], seg_end if seg_end is not None else float("inf")
    for g in groups:
        text = decode([ids[k] for k in g]).strip()
        if not text:
            continue
        start = min(max(times[g[0] - 1] if g[0] else seg_start, seg_start), hi)
        words.append([start, min(max(times[g[-1]], start), hi), text, None])
    if words:  # the first and last words soak up the pauses around them: trim them, as
        # faster-whisper does, to twice the median word length (at most 1.4 s)
        longest = 2 * min(0.7, float(np.median([w[1] - w[0] for w in words])) or 0.7)
        words[0][0] = max(words[0][0], words[0][1] - longest)
        words[-1][1] = min(words[-1][1], words[-1][0] + longest)
    return [(round(a, 3), round(b, 3), text, p) for a, b, text, p in words]


def ctc_segments(words: list[dict], seconds_per_frame: float) -> list[Piece]:
    """CTC word offsets (frames) → pieces split at pauses, so subtitles stay readable."""
    pieces, cur = [], []
    for w in words:
        if cur and (
            (w["start_offset"] - cur[-1]["end_offset"]) * seconds_per_frame > CTC_GAP_S or len(cur) >= CTC_MAX_WORDS
        ):
            pieces.append(cur)
            cur = []
        cur.append(w)
    if cur:
        pieces.append(cur)
    return [
        Piece(
            p[0]["start_offset"] * seconds_per_frame,
            p[-1]["end_offset"] * seconds_per_frame,
            " ".join(w["word"] for w in p),
            [(w["start_offset"] * seconds_per_frame, w["end_offset"] * seconds_per_frame, w["word"], None) for w in p],
        )
        for p in pieces
    ]


def cache_suppression(model) -> None:
    """Whisper's suppressed-token masks built once per ``generate`` call instead of at every
    decoding step. transformers' SuppressTokens(AtBegin)LogitsProcessor run ``torch.isin`` over
    the whole vocabulary at each step: 5.2 + 0.8 ms of a ~17 ms tiny.en step on 2 cores (2.4 s
    of an 11.3 s transcript of 183 s). The processors keep their class's behaviour and order;
    their mask is kept after the first step. A transformers without the hook runs as it is."""
    import torch
    from transformers.generation.logits_process import (
        SuppressTokensAtBeginLogitsProcessor,
        SuppressTokensLogitsProcessor,
    )

    def masked(base):
        at_begin = base is SuppressTokensAtBeginLogitsProcessor
        tokens = "begin_suppress_tokens" if at_begin else "suppress_tokens"

        class Cached(base):
            def __call__(self, input_ids, scores):
                key = (scores.shape[-1], scores.device)
                if getattr(self, "_key", None) != key:
                    self._key = key
                    self._mask = torch.isin(torch.arange(key[0], device=key[1]), getattr(self, tokens).to(key[1]))
                if at_begin and input_ids.shape[-1] != self.begin_index:
                    return scores
                return scores.masked_fill(self._mask, -float("inf"))

        return Cached

    swaps = {base: masked(base) for base in (SuppressTokensLogitsProcessor, SuppressTokensAtBeginLogitsProcessor)}
    retrieve = getattr(model, "_retrieve_logit_processors", None)
    if retrieve is None:
        return

    def cached(*args, **kwargs):
        procs = retrieve(*args, **kwargs)
        for p in procs or ():
            if type(p) in swaps:
                p.__class__ = swaps[type(p)]
        return procs

    model._retrieve_logit_processors = cached


class HFSpeechEngine(SpeechEngine):
    """Whisper (WhisperForConditionalGeneration) or a *ForCTC model on transformers."""

    runtime = "transformers"
    batch_windows = 16  # the most windows --batch-size may put in one generate call (decode_batch)

    def __init__(self, card, device="auto", dtype="auto"):
        self.card = card
        self.device = resolve_device(device)
        self.torch_dtype, self.dtype = resolve_dtype(dtype, self.device, auto_dtype(self.device, False))
        self.folder = model_folder(card)
        try:
            cfg = json.loads((self.folder / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise TaskError(
                f"{self.folder} has no readable config.json ({exc}); point --model at a "
                f"transformers speech model folder"
            ) from None
        arch = (cfg.get("architectures") or [""])[0]
        self.ctc = arch.endswith("ForCTC")
        if not self.ctc and cfg.get("model_type") != "whisper":
            raise TaskError(
                f"`{card.name}` is a {arch or cfg.get('model_type')} model; the transformers "
                f"runtime transcribes with Whisper or *ForCTC models"
            )
        self.takes_language = not self.ctc  # a CTC model is given audio only: no language, no task
        self.model, self.processor = self._load()
        self.sample_rate = int(self.processor.feature_extractor.sampling_rate)

    def _load(self):
        from transformers import AutoModelForCTC, AutoProcessor, WhisperForConditionalGeneration

        cls = AutoModelForCTC if self.ctc else WhisperForConditionalGeneration
        model = cls.from_pretrained(self.folder, dtype=self.torch_dtype).to(self.device).eval()
        if not self.ctc and self.device == "cpu" and self.dtype == "float32":
            transpose_head(model)
        if not self.ctc:
            cache_suppression(model)
        return model, AutoProcessor.from_pretrained(self.folder)

    @property
    def multilingual(self) -> bool:
        return not self.ctc and bool(getattr(self.model.generation_config, "is_multilingual", False))

    def check_options(self, options) -> None:
        if (
            options.word_timestamps
            and not self.ctc
            and not getattr(self.model.generation_config, "alignment_heads", None)
        ):
            raise TaskError(
                f"`{self.card.name}` names no alignment heads in its generation_config.json, "
                f"which word timestamps need on transformers; drop --word-timestamps (and "
                f"--highlight-words), or use --runtime ctranslate2"
            )
        if self.ctc and options.task == "translate":
            raise TaskError(f"`{self.card.name}` is a CTC model and cannot translate; use a multilingual Whisper")

    def languages(self) -> list[str]:
        return [] if self.ctc else [tok.strip("<|>") for tok in self.model.generation_config.lang_to_id]

    def decode(self, samples, options, state: FileState):
        if self.ctc:
            return [p if options.word_timestamps else Piece(p.start, p.end, p.text) for p in self._ctc(samples)]
        return self._seek(self._whisper([samples], options, state, state.previous)[0], samples, options, state)

    def _seek(self, pieces, samples, options, state: FileState) -> list[Piece]:
        """A window's pieces and those of the speech after its last timestamp (``_tail``), one
        generate call per pass."""

        def once(x, o, s):
            return self._whisper([x], o, s, s.previous)[0]

        return pieces + self._tail(samples, pieces, options, state, decode=once)

    def decode_batch(self, windows, options, state: FileState):
        """Consecutive windows of one file, as the ctranslate2 runtime batches them: the first
        alone, prompted with the text before it (``state.previous``), the rest as one
        ``generate`` call over the stacked windows, unprompted (the text just before each is
        decoded in the same batch). transformers applies Whisper's temperature fallback to each
        window of the batch on its own; speech left after a window's last timestamp is decoded
        alone (``_tail``)."""
        if self.ctc:
            return super().decode_batch(windows, options, state)
        first = [self.decode(windows[0], options, state)] if state.previous.strip() else []
        rest = windows[len(first) :]
        if not rest:
            return first
        batch = self._whisper(rest, options, state, "")
        return first + [self._seek(pieces, samples, options, state) for pieces, samples in zip(batch, rest)]

    def _whisper(self, windows, options, state: FileState, prompt: str) -> list[list[Piece]]:
        """Pieces per window, from one ``generate`` call over all of them, each prompted with
        ``prompt`` (the text before them) when it is not empty."""
        import torch

        fe = self.processor.feature_extractor
        feats = fe(windows, sampling_rate=self.sample_rate, return_tensors="pt").input_features
        feats = feats.to(self.device, self.torch_dtype)
        gc = self.model.generation_config
        kwargs = {}
        if self.multilingual:
            if state.language is None:  # detected once per file (its first window), then kept
                lang_id = int(self.model.detect_language(feats[:1])[0])
                state.language = self.processor.tokenizer.convert_ids_to_tokens(lang_id).strip("<|>")
            kwargs = {"language": state.language, "task": options.task}
        if prompt.strip():  # continue the file's text, as the ctranslate2 runtime does
            kwargs["prompt_ids"] = self.processor.get_prompt_ids(prompt.strip(), return_tensors="pt").to(self.device)
        if options.word_timestamps:  # token times from the cross-attention alignment heads
            kwargs.update(return_token_timestamps=True, return_dict_in_generate=True)
        torch.manual_seed(0)  # a temperature fallback samples: the same audio gives the same text
        with torch.inference_mode():
            # One generate call per window: transformers would otherwise seek on from a window's
            # last timestamp through the padding to 30 s (an encoder pass and a decode each,
            # ~0.4 s for tiny.en on 2 cores); _tail decodes the speech left there instead.
            out = self.model.generate(
                feats,
                return_timestamps=True,
                num_beams=options.beam_size or 1,
                force_unique_generate_call=True,
                **FALLBACK,
                **kwargs,
            )
        tok = self.processor.tokenizer
        rows = out.tolist() if hasattr(out, "tolist") else out["sequences"].tolist()
        times = out["token_timestamps"].tolist() if options.word_timestamps else [None] * len(rows)
        sot = gc.decoder_start_token_id  # a prompted row starts with the prompt: keep what follows it
        cut = [ids.index(sot) + 1 if sot in ids else 0 for ids in rows]
        return [
            whisper_segments(
                ids[k:],
                gc.no_timestamps_token_id + 1,
                gc.eos_token_id,
                lambda t: tok.decode(t, skip_special_tokens=True),
                ts and ts[k:],
            )
            for ids, ts, k in zip(rows, times, cut)
        ]

    def _ctc(self, samples) -> list[Piece]:
        import torch

        inputs = self.processor(samples, sampling_rate=self.sample_rate, return_tensors="pt")
        with torch.inference_mode():
            logits = self.model(inputs.input_values.to(self.device, self.torch_dtype)).logits
        ids = logits.argmax(-1)[0]
        out = self.processor.tokenizer.decode(ids, output_word_offsets=True)
        ratio = self.model.config.inputs_to_logits_ratio / self.sample_rate
        return ctc_segments(out.word_offsets, ratio)
