"""GGUF → a cached safetensors folder, once per GGUF digest.

transformers dequantises a GGUF on every load (~20 s for SmolLM2-135M on two cores). Converting
once into ``<cache>/gguf/<digest>/`` (config, tokenizer, safetensors) makes later loads take about
a second. The folder is keyed by the GGUF's own digest, so a different file never reuses it, and
the run log keeps recording the GGUF's digest (the ModelCard is the GGUF's, not the folder's).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from taskrun.models.gguf import gguf_file
from taskrun.tasks.base import ModelCard, TaskError


def converted_dir(card: ModelCard) -> Path:
    from taskrun.models.resolve import cache_dir

    return cache_dir() / "gguf" / card.digest.replace("sha256:", "")[:32]


def ensure_converted(card: ModelCard) -> Path:
    """The HF folder for a GGUF card, converting it first if this digest was never converted."""
    src = gguf_file(card)
    if src is None:
        return Path(card.path)
    target = converted_dir(card)
    if (target / ".done").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp folder and rename: a crash never leaves half a model behind, and two
    # processes converting at once each finish with a complete folder.
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        try:
            tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
            model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
        except ImportError as exc:
            raise TaskError(f"reading GGUF weights needs {exc.name or 'gguf'}: pip install gguf") from None
        except Exception as exc:  # an unsupported GGUF architecture or quantisation
            raise TaskError(f"transformers could not read {src.name} ({type(exc).__name__}: {exc}); "
                            f"give an HF folder of the same model with --model") from None
        tok.save_pretrained(tmp)
        _save_plain(model, tmp)
        (tmp / "source.txt").write_text(f"{src}\n{card.digest}\n")
        (tmp / ".done").write_text("ok")
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _save_plain(model, folder: Path) -> None:
    """Save dequantised weights as plain safetensors: transformers refuses to ``save_pretrained`` a
    model loaded from GGUF (it still counts as quantised), though its tensors are ordinary floats."""
    from safetensors.torch import save_file

    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    cfg.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    state = model.state_dict()
    if getattr(cfg, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: rebuilt from the embeddings on load
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
