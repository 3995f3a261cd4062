"""A tiny random Stable Diffusion pipeline (UNet2DConditionModel, AutoencoderKL, CLIPTextModel and
a CLIPTokenizer whose vocab.json/merges.txt are written here), saved as a diffusers folder.

Shaped like diffusers' own ``get_dummy_components``: seconds to build, draws noise, exercises
every part of the text-to-image path (prompt encoding, guidance, scheduler, VAE decode).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.tiny import done, once

WORDS = ["a", "red", "fox", "cat", "dog", "the", "handwritten", "photo", "of", "blurry", "7"]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's byte → printable-character table, so every byte has a base token."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_clip_tokenizer_files(folder: Path) -> None:
    chars = list(_bytes_to_unicode().values())
    vocab = chars + [c + "</w>" for c in chars]
    merges = []
    for w in WORDS:  # merge each word's letters left to right, ending in the word token
        cur = w[0]
        for i, ch in enumerate(w[1:], 1):
            nxt = ch + "</w>" if i == len(w) - 1 else ch
            merges.append(f"{cur} {nxt}")
            cur = cur + nxt
            if cur not in vocab:
                vocab.append(cur)
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(dict.fromkeys(merges)) + "\n")


def build(root: Path) -> Path:
    folder, ready = once(root, "tiny-sd")
    if ready:
        return folder
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    tok_dir = folder / "_tok"
    write_clip_tokenizer_files(tok_dir)
    tokenizer = CLIPTokenizer(str(tok_dir / "vocab.json"), str(tok_dir / "merges.txt"), model_max_length=16)
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=1,
        sample_size=16,
        in_channels=4,
        out_channels=4,
        cross_attention_dim=16,
        norm_num_groups=4,
        attention_head_dim=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
    )
    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=(8, 16),
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        norm_num_groups=4,
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
    )
    torch.manual_seed(0)
    text = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=16,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            projection_dim=16,
        )
    )
    sched = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    pipe = StableDiffusionPipeline(
        unet=unet.eval(),
        vae=vae.eval(),
        text_encoder=text.eval(),
        tokenizer=tokenizer,
        scheduler=sched,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(folder)
    done(folder)
    return folder
