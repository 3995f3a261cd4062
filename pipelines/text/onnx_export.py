"""A transformers sentence encoder → a cached ONNX graph, once per model digest (for the
onnxruntime text-encoder engine, pipelines/text/ort_encoder.py).

The graph takes ``input_ids`` and ``attention_mask`` (batch × tokens, any size) and returns the
pooled, unnormalised float32 vector of each row, with the folder's pooling (mean over the mask, or
the CLS token) inside the graph, so one call returns what ``TextEncoderEngine.encode_batch`` does.
Exported in float32 with torch's TorchScript exporter (``dynamo=False``: it needs the ``onnx``
package but not onnxscript, and traces these encoders in about a second).

The folder ``<cache>/onnx-text/<digest>-v1/`` is a self-checking cache entry (models/cache_entry.py), like
the GGUF and CTranslate2 conversions: a manifest checked on every use, rebuilt with one warning line
when damaged. The run log notes its digest (what actually ran) beside the source model's.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path

from taskrun.models import cache_entry
from taskrun.pipelines.text.engine import pooling_mode
from taskrun.tasks.base import ModelCard, TaskError

GRAPH = "model.onnx"
INFO = "encoder.json"  # dim and pooling of the graph, read by the engine without loading torch
OPSET = 17
EXPORT_VERSION = 1  # bump when the graph changes shape: older entries are then rebuilt


def exported_dir(card: ModelCard) -> Path:
    from taskrun.models.resolve import cache_dir

    return cache_dir() / "onnx-text" / f"{card.digest.replace('sha256:', '')[:32]}-v{EXPORT_VERSION}"


def ensure_exported(card: ModelCard) -> Path:
    """The folder holding the ONNX graph of ``card``, exporting it first when this digest has no
    sound export."""
    return cache_entry.build_or_temp(
        exported_dir(card), card, "the transformers folder", lambda folder: export(card, folder)
    )


def export(card: ModelCard, folder: Path) -> None:
    """Trace ``card``'s encoder with its pooling into ``folder/model.onnx`` (float32)."""
    try:
        import onnx  # noqa: F401  (torch's exporter needs it; say so before loading any weights)
    except ImportError:
        raise TaskError(
            "the onnxruntime runtime exports the model to ONNX once, which needs the `onnx` "
            "package: pip install onnx (or use --runtime transformers)"
        ) from None
    import torch
    from transformers import AutoModel

    from taskrun.pipelines.device import configure_threads

    configure_threads()
    try:
        model = AutoModel.from_pretrained(card.path, dtype=torch.float32, attn_implementation="eager").eval()
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        raise TaskError(f"could not load {card.name} from {card.path}: {str(exc).splitlines()[0]}") from None
    pooling = pooling_mode(Path(card.path))
    wrapped = _pooled(model, pooling, getattr(model.config, "type_vocab_size", 0) > 0)
    example = (torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
    example[1][1, 5:] = 0  # a padded row, so the trace keeps the mask's path
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.inference_mode():
            warnings.simplefilter("ignore")  # the tracer's warnings are about Python branches on shapes
            torch.onnx.export(
                wrapped,
                example,
                str(folder / GRAPH),
                input_names=["input_ids", "attention_mask"],
                output_names=["vector"],
                opset_version=OPSET,
                dynamo=False,
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "tokens"},
                    "attention_mask": {0: "batch", 1: "tokens"},
                    "vector": {0: "batch"},
                },
            )
    except Exception as exc:  # an architecture the tracer cannot follow
        raise TaskError(
            f"could not export {card.name} to ONNX ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); use --runtime transformers"
        ) from None
    (folder / INFO).write_text(
        json.dumps({"dim": int(model.config.hidden_size), "pooling": pooling, "opset": OPSET, "source": card.digest})
        + "\n"
    )


def read_info(folder: Path) -> dict:
    return json.loads((folder / INFO).read_text())


def _pooled(model, pooling: str, token_types: bool):
    """The encoder and its pooling as one module, pooled the way the transformers engine pools."""
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self, model, pooling: str, token_types: bool) -> None:
            super().__init__()
            self.model, self.pooling, self.token_types = model, pooling, token_types

        def forward(self, input_ids, attention_mask):
            extra = {"token_type_ids": torch.zeros_like(input_ids)} if self.token_types else {}
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
            if self.pooling == "cls":
                return hidden[:, 0]
            m = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)

    return Pooled(model, pooling, token_types)
