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
    return _build(root, "tiny-bert", hidden=32, layers=2, window=64)


def build_slow(root: Path) -> Path:
    """The same encoder, wider and with a 128-token window: an embeddings request of 2,048 long
    texts runs for many seconds in forward passes of a fraction of a second each (32 batches of
    64), so a test can leave in the middle of one."""
    return _build(root, "slow-bert", hidden=128, layers=8, window=128)


def _build(root: Path, name: str, hidden: int, layers: int, window: int) -> Path:
    folder, ready = once(root, name)
    if ready:
        return folder
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tok = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    tok.model_max_length = window
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=window,
    )
    BertModel(cfg).eval().save_pretrained(folder)
    done(folder)
    return folder
