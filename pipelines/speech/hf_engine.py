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

from taskrun.pipelines.device import auto_dtype, resolve_device, resolve_dtype
from taskrun.pipelines.speech.engine import FileState, Piece, SpeechEngine
from taskrun.tasks.base import TaskError

TIME_PRECISION = 0.02  # seconds per Whisper timestamp token
# Whisper's guards against repetition loops and invented text, as openai/whisper and faster-whisper
# use them (the compression ratio here is over token ids, hence 1.35 rather than 2.4): a window
# whose output is too repetitive or too unlikely is decoded again at a higher temperature.
FALLBACK = {"temperature": (0.0, 0.2, 0.4, 0.6, 0.8, 1.0), "compression_ratio_threshold": 1.35,
            "logprob_threshold": -1.0, "no_speech_threshold": 0.6}
CTC_GAP_S = 0.8  # a pause this long starts a new CTC segment
CTC_MAX_WORDS = 16


def model_folder(card) -> Path:
    if card.architecture == "WhisperCT2":
        from taskrun.pipelines.speech.ct2_convert import converted_folder
        from taskrun.models.resolve import cache_dir

        return converted_folder(card, cache_dir())
    return Path(card.path)


def whisper_segments(ids: list[int], ts_begin: int, eot: int, decode) -> list[Piece]:
    """Whisper output tokens → pieces. Timestamps come in pairs around each segment's text
    (<|0.00|> text <|2.40|><|2.40|> text ...); a last segment without a closing timestamp
    runs to the end of the audio (end None)."""
    pieces, text, start, last = [], [], None, 0.0
    for t in ids:
        if t >= ts_begin:
            time = (t - ts_begin) * TIME_PRECISION
            if text:
                pieces.append(Piece(last if start is None else start, time, decode(text)))
                text, start, last = [], None, time
            else:
                start = time
        elif t < eot:
            text.append(t)
    if text:
        pieces.append(Piece(last if start is None else start, None, decode(text)))
    return pieces


def ctc_segments(words: list[dict], seconds_per_frame: float) -> list[Piece]:
    """CTC word offsets (frames) → pieces split at pauses, so subtitles stay readable."""
    pieces, cur = [], []
    for w in words:
        if cur and ((w["start_offset"] - cur[-1]["end_offset"]) * seconds_per_frame > CTC_GAP_S
                    or len(cur) >= CTC_MAX_WORDS):
            pieces.append(cur)
            cur = []
        cur.append(w)
    if cur:
        pieces.append(cur)
    return [Piece(p[0]["start_offset"] * seconds_per_frame, p[-1]["end_offset"] * seconds_per_frame,
                  " ".join(w["word"] for w in p)) for p in pieces]


class HFSpeechEngine(SpeechEngine):
    """Whisper (WhisperForConditionalGeneration) or a *ForCTC model on transformers."""

    runtime = "transformers"

    def __init__(self, card, device="auto", dtype="auto"):
        self.card = card
        self.device = resolve_device(device)
        self.torch_dtype, self.dtype = resolve_dtype(dtype, self.device, auto_dtype(self.device, False))
        self.folder = model_folder(card)
        try:
            cfg = json.loads((self.folder / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise TaskError(f"{self.folder} has no readable config.json ({exc}); point --model at a "
                            f"transformers speech model folder") from None
        arch = (cfg.get("architectures") or [""])[0]
        self.ctc = arch.endswith("ForCTC")
        if not self.ctc and cfg.get("model_type") != "whisper":
            raise TaskError(f"`{card.name}` is a {arch or cfg.get('model_type')} model; the transformers "
                            f"runtime transcribes with Whisper or *ForCTC models")
        self.takes_language = not self.ctc  # a CTC model is given audio only: no language, no task
        self.model, self.processor = self._load()
        self.sample_rate = int(self.processor.feature_extractor.sampling_rate)

    def _load(self):
        from transformers import AutoModelForCTC, AutoProcessor, WhisperForConditionalGeneration

        cls = AutoModelForCTC if self.ctc else WhisperForConditionalGeneration
        model = cls.from_pretrained(self.folder, dtype=self.torch_dtype).to(self.device).eval()
        return model, AutoProcessor.from_pretrained(self.folder)

    @property
    def multilingual(self) -> bool:
        return not self.ctc and bool(getattr(self.model.generation_config, "is_multilingual", False))

    def check_options(self, options) -> None:
        if options.word_timestamps:
            raise TaskError("--word-timestamps needs the ctranslate2 runtime (faster-whisper); "
                            "drop it, or use --runtime ctranslate2")
        if self.ctc and options.task == "translate":
            raise TaskError(f"`{self.card.name}` is a CTC model and cannot translate; use a multilingual Whisper")

    def languages(self) -> list[str]:
        return [] if self.ctc else [tok.strip("<|>") for tok in self.model.generation_config.lang_to_id]

    def decode(self, samples, options, state: FileState):
        return self._ctc(samples) if self.ctc else self._whisper(samples, options, state)

    def _whisper(self, samples, options, state: FileState) -> list[Piece]:
        import torch

        fe = self.processor.feature_extractor
        feats = fe(samples, sampling_rate=self.sample_rate, return_tensors="pt").input_features
        feats = feats.to(self.device, self.torch_dtype)
        gc = self.model.generation_config
        kwargs = {}
        if self.multilingual:
            if state.language is None:  # detected once per file, then kept for every window
                lang_id = int(self.model.detect_language(feats)[0])
                state.language = self.processor.tokenizer.convert_ids_to_tokens(lang_id).strip("<|>")
            kwargs = {"language": state.language, "task": options.task}
        if state.previous.strip():  # continue the file's text, as the ctranslate2 runtime does
            kwargs["prompt_ids"] = self.processor.get_prompt_ids(state.previous.strip(), return_tensors="pt") \
                .to(self.device)
        torch.manual_seed(0)  # a temperature fallback samples: the same audio gives the same text
        with torch.inference_mode():
            out = self.model.generate(feats, return_timestamps=True, num_beams=options.beam_size or 1,
                                      **FALLBACK, **kwargs)
        tok = self.processor.tokenizer
        ids = out[0].tolist() if hasattr(out, "tolist") else out["sequences"][0].tolist()
        return whisper_segments(ids, gc.no_timestamps_token_id + 1, gc.eos_token_id,
                                lambda t: tok.decode(t, skip_special_tokens=True))

    def _ctc(self, samples) -> list[Piece]:
        import torch

        inputs = self.processor(samples, sampling_rate=self.sample_rate, return_tensors="pt")
        with torch.inference_mode():
            logits = self.model(inputs.input_values.to(self.device, self.torch_dtype)).logits
        ids = logits.argmax(-1)[0]
        out = self.processor.tokenizer.decode(ids, output_word_offsets=True)
        ratio = self.model.config.inputs_to_logits_ratio / self.sample_rate
        return ctc_segments(out.word_offsets, ratio)
