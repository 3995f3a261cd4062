"""A tiny random Llama (the SmolLM2 architecture) with a byte-level BPE tokenizer trained in code
and a ChatML template like SmolLM2's, saved as an HF folder."""

from __future__ import annotations

from pathlib import Path

from tests.tiny import TinyCase, done, no_case, once

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The capital of France is Paris.",
    "Count from one to ten: one two three four five six seven.",
    "The meeting decided to ship the release on Friday. Alice owns the budget; Bob owns testing.",
    "What is the capital of France?",
    "Summarize the following text in two sentences.",
] * 20
CONTEXT = 512  # tokens: small, so the tests can overflow it cheaply


def build(root: Path) -> Path:
    folder, ready = once(root, "tiny-llama")
    if ready:
        return folder
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = CONTEXT
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
        initializer_range=0.3,
    )  # large random weights: varied, non-repeating text
    LlamaForCausalLM(cfg).eval().save_pretrained(folder)
    done(folder)
    return folder


def case(root, runtime="transformers"):
    if runtime not in ("transformers", "llama.cpp"):
        no_case("generate", runtime)
    from tests.tiny.gguf_llama import build as build_gguf

    model = build(root) if runtime == "transformers" else build_gguf(root)
    return TinyCase(
        model=str(model), args=["What is the capital of France?"], options=["--max-tokens", "8", "--seed", "1"]
    )
