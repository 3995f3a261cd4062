"""A tiny random wav2vec2 CTC model (Wav2Vec2ForCTC at toy sizes) with a character vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tiny import done, once


def build_ctc(root: Path) -> Path:
    folder, ready = once(root, "tiny-wav2vec2-ctc")
    if ready:
        return folder
    import torch
    from transformers import (
        Wav2Vec2Config,
        Wav2Vec2CTCTokenizer,
        Wav2Vec2FeatureExtractor,
        Wav2Vec2ForCTC,
        Wav2Vec2Processor,
    )

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "|": 4}
    vocab.update({c: i + 5 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz'")})
    (folder / "vocab.json").write_text(json.dumps(vocab))
    tok = Wav2Vec2CTCTokenizer(str(folder / "vocab.json"), word_delimiter_token="|")
    fe = Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True, return_attention_mask=False
    )
    Wav2Vec2Processor(feature_extractor=fe, tokenizer=tok).save_pretrained(folder)
    torch.manual_seed(0)
    cfg = Wav2Vec2Config(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(8,) * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        pad_token_id=0,
    )
    Wav2Vec2ForCTC(cfg).eval().save_pretrained(folder)
    done(folder)
    return folder
