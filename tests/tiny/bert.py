"""A tiny random BERT sentence encoder (the MiniLM architecture), saved as an HF folder."""

from __future__ import annotations

from pathlib import Path

from tests.tiny import done, once

VOCAB = (
    ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    + ["the", "cat", "dog", "kitten", "stock", "price", "movie", "good", "bad", "##s", "##ing", ".", ",", "!"]
)


def build(root: Path) -> Path:
    folder, ready = once(root, "tiny-bert")
    if ready:
        return folder
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tok = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    tok.model_max_length = 64
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    BertModel(cfg).eval().save_pretrained(folder)
    done(folder)
    return folder
