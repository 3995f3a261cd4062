"""GGUF → a cached safetensors folder, once per GGUF digest (for the transformers runtime; the
llama.cpp engine reads the GGUF itself).

transformers dequantises a GGUF on every load (~20 s for SmolLM2-135M on two cores). Converting
once into ``<cache>/gguf/<digest>/`` (config, tokenizer, float16 safetensors) makes later loads take
about a second. float16 holds a dequantised Q4/Q8 weight (a float16 scale times a small integer)
to within float16's rounding, at half float32's size on disk; the runtime loads it into the dtype it
computes in. The folder is keyed by the GGUF's own digest, so a different file never reuses it.

The folder is a self-checking cache entry (models/cache_entry.py): a manifest of its files, checked
on every use; a damaged folder is removed and converted again, with one warning line. The run log
keeps recording the GGUF's digest as the model's (the ModelCard is the GGUF's) and notes the
converted folder's digest, which is what actually ran.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from taskrun.models import cache_entry
from taskrun.models.gguf import gguf_file
from taskrun.tasks.base import ModelCard, TaskError


def converted_dir(card: ModelCard) -> Path:
    from taskrun.models.resolve import cache_dir

    return cache_dir() / "gguf" / card.digest.replace("sha256:", "")[:32]


def ensure_converted(card: ModelCard) -> Path:
    """The HF folder for a GGUF card, converting it first if this digest has no sound conversion."""
    src = gguf_file(card)
    if src is None:
        return Path(card.path)

    def build(folder: Path) -> None:
        _convert(src, folder)
        (folder / "source.txt").write_text(f"{src}\n{card.digest}\n")

    return cache_entry.build_once(converted_dir(card), card, "the GGUF", build)


def _convert(src: Path, folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with _no_progress_bar():
            tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
            model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
    except ImportError as exc:
        raise TaskError(f"reading GGUF weights needs {exc.name or 'gguf'}: pip install gguf") from None
    except Exception as exc:  # an unsupported GGUF architecture or quantisation
        raise TaskError(
            f"transformers could not read {src.name} ({type(exc).__name__}: {exc}); "
            f"give an HF folder of the same model with --model"
        ) from None
    tok.save_pretrained(folder)
    _save_plain(model, folder)


@contextlib.contextmanager
def _no_progress_bar():
    """transformers draws a tqdm bar while it dequantises (its own ``tqdm``, not the one its
    disable_progress_bar switches off); taskrun draws its own progress on stderr, so both are
    silenced for the conversion and put back after it."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was, bar = hf_logging.is_progress_bar_enabled(), getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    if bar is not None:
        gguf_utils.tqdm = lambda iterable=None, *a, **k: iterable
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        if was:
            hf_logging.enable_progress_bar()


def _save_plain(model, folder: Path) -> None:
    """Save dequantised weights as plain float16 safetensors: transformers refuses to
    ``save_pretrained`` a model loaded from GGUF (it still counts as quantised), though its tensors
    are ordinary floats."""
    import torch
    from safetensors.torch import save_file

    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    cfg.dtype = torch.float16  # what the file holds; the runtime still loads it into its own dtype
    cfg.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    state = model.state_dict()
    if getattr(cfg, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: rebuilt from the embeddings on load
    save_file(
        {k: (v.to(torch.float16) if v.is_floating_point() else v).contiguous() for k, v in state.items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
