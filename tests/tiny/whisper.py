"""A tiny random Whisper (the tiny.en architecture at toy sizes), saved as a transformers folder
with a tiny.en-shaped tokenizer built in code, and the same weights as a CTranslate2 folder; plus a
short real speech clip cut from samples/meeting.wav."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tiny import done, once

SAMPLES = Path(__file__).resolve().parents[2] / "samples"

# tiny.en's language tokens in Whisper's order (its tokenizer names Hebrew iw and Javanese jw).
LANGUAGES = [
    "en",
    "zh",
    "de",
    "es",
    "ru",
    "ko",
    "fr",
    "ja",
    "pt",
    "tr",
    "pl",
    "ca",
    "nl",
    "ar",
    "sv",
    "it",
    "id",
    "hi",
    "fi",
    "vi",
    "iw",
    "uk",
    "el",
    "ms",
    "cs",
    "ro",
    "da",
    "hu",
    "ta",
    "no",
    "th",
    "ur",
    "hr",
    "bg",
    "lt",
    "la",
    "mi",
    "ml",
    "cy",
    "sk",
    "te",
    "fa",
    "lv",
    "bn",
    "sr",
    "az",
    "sl",
    "kn",
    "et",
    "mk",
    "br",
    "eu",
    "is",
    "hy",
    "ne",
    "mn",
    "bs",
    "kk",
    "sq",
    "sw",
    "gl",
    "mr",
    "pa",
    "si",
    "km",
    "sn",
    "yo",
    "so",
    "af",
    "oc",
    "ka",
    "be",
    "tg",
    "sd",
    "gu",
    "am",
    "yi",
    "lo",
    "uz",
    "fo",
    "ht",
    "ps",
    "tk",
    "nn",
    "mt",
    "sa",
    "lb",
    "my",
    "bo",
    "tl",
    "mg",
    "as",
    "tt",
    "haw",
    "ln",
    "ha",
    "ba",
    "jw",
    "su",
]
SPECIAL = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    *(f"<|{c}|>" for c in LANGUAGES),
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nocaptions|>",
    "<|notimestamps|>",
]
TIMESTAMPS = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]  # <|0.00|> .. <|30.00|>, after <|notimestamps|>
# Text tokens below <|endoftext|>, as in tiny.en: the pipelines and CTranslate2 tell an English-only
# Whisper by its 51864-token vocabulary and expect its special tokens at tiny.en's ids.
TEXT_IDS = 50256
VOCAB_SIZE = TEXT_IDS + len(SPECIAL) + len(TIMESTAMPS)
CORPUS = [
    "He was not an ill disposed young man, unless to be rather cold hearted and rather selfish.",
    "The meeting decided to ship the release on Friday. Alice owns the budget; Bob owns testing.",
    "Count from one to ten: one two three four five six seven eight nine ten.",
    "What did they say? Nothing at all, and then they left the room.",
    '(laughs) [music] ♪♪ "Quiet -- please," she said: <<yes>> {sic} ((inaudible))',
] * 20


def _text_vocab() -> tuple[dict[str, int], list]:
    """(vocab, merges) of a byte-level BPE trained on CORPUS. Its 256 bytes come first in GPT-2's
    order, so " " is id 220 as in Whisper (the blank it suppresses at the start); the rest up to
    TEXT_IDS are word tokens that no merge reaches, which a random decoder still emits and which
    decode to plain words."""
    from itertools import product
    from string import ascii_lowercase

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(vocab_size=600, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    vocab = {t: i for i, t in enumerate(bytes_to_unicode().values())}
    for t, _ in sorted(bpe.get_vocab().items(), key=lambda kv: kv[1]):
        vocab.setdefault(t, len(vocab))
    words = ("Ġ" + "".join(w) for n in (3, 4) for w in product(ascii_lowercase, repeat=n))
    while len(vocab) < TEXT_IDS:
        vocab.setdefault(next(words), len(vocab))
    return vocab, json.loads(bpe.to_str())["model"]["merges"]


def tokenizer_json(root: Path) -> Path:
    """tokenizer.json of the tiny Whisper: tiny.en's special and timestamp tokens, at tiny.en's
    ids, over a small byte-level BPE."""
    folder, ready = once(root, "tiny-whisper-tokenizer")
    path = folder / "tokenizer.json"
    if ready:
        return path
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab, merges = _text_vocab()
    tok = Tokenizer(models.BPE(vocab, [tuple(m) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    # Timestamps as the Hugging Face hub's Whisper tokenizers carry them: added, not special.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TIMESTAMPS])
    sot, eot, no_ts = "<|startoftranscript|>", "<|endoftext|>", "<|notimestamps|>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{sot} {no_ts} $A:0 {eot}",
        pair=f"{sot} {no_ts} $A:0 $B:1 {eot}:1",
        special_tokens=[(t, tok.token_to_id(t)) for t in (sot, eot, no_ts)],
    )
    assert tok.get_vocab_size() == VOCAB_SIZE and tok.token_to_id(eot) == TEXT_IDS
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    done(folder)
    return path


def build(root: Path) -> Path:
    folder, ready = once(root, "tiny-whisper")
    if ready:
        return folder
    import torch
    from tokenizers import Tokenizer
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from taskrun.pipelines.speech.ct2_convert import save_whisper_folder

    tokens = tokenizer_json(root)
    ids = Tokenizer.from_file(str(tokens)).token_to_id
    sot, eot = ids("<|startoftranscript|>"), ids("<|endoftext|>")
    torch.manual_seed(0)
    cfg = WhisperConfig(
        vocab_size=VOCAB_SIZE,
        num_mel_bins=80,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_source_positions=1500,
        max_target_positions=448,
        decoder_start_token_id=sot,
        bos_token_id=sot,
        eos_token_id=eot,
        pad_token_id=eot,
        begin_suppress_tokens=[ids("Ġ"), eot],
        suppress_tokens=[],
        tie_word_embeddings=True,
    )
    model = WhisperForConditionalGeneration(cfg).eval()
    folder.mkdir(parents=True, exist_ok=True)
    save_whisper_folder(model, tokens, folder, alignment_heads=[[0, 0], [0, 1]])
    # A random decoder rarely says end-of-text: cap its output so a test decodes in a second.
    model.generation_config.max_length = 40
    model.generation_config.save_pretrained(folder)
    done(folder)
    return folder


def build_ct2(root: Path) -> Path:
    """The tiny model in CTranslate2 format, converted by ctranslate2's own converter."""
    folder, ready = once(root, "tiny-whisper-ct2")
    if ready:
        return folder
    import shutil

    from ctranslate2.converters import TransformersConverter

    src = build(root)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    converter = TransformersConverter(str(src), copy_files=["tokenizer.json", "generation_config.json"])
    converter.convert(str(tmp), quantization="float32", force=True)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    done(folder)
    return folder


def clip(root: Path, start_s: float = 9.3, end_s: float = 12.7, name: str = "clip.wav") -> Path:
    """Real speech from samples/meeting.wav ("he was not an ill disposed young man")."""
    import soundfile as sf

    path = root / name
    if not path.exists():
        audio, sr = sf.read(SAMPLES / "meeting.wav", dtype="int16")
        sf.write(path, audio[int(start_s * sr) : int(end_s * sr)], sr, subtype="PCM_16")
    return path
