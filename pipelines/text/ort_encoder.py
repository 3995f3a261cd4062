"""The text-encoder engine on ONNX Runtime: the model exported once to ONNX (pooling inside the
graph, pipelines/text/onnx_export.py), run in float32 on the CPU.

Why: on a CPU without bf16 matrix units (AVX2, AVX-512 without BF16) ONNX Runtime's fused float32
kernels run MiniLM 1.2-1.4x faster than torch's float32 forward on the same length-sorted batches
(benchmarks/bench_embed.py). Where the CPU has bf16 (AMX), the transformers engine in bf16 is faster
still, so pipelines/text/encoder.py picks this engine only on CPUs without it (``auto_runtime``).
Loading it imports no torch once the export is cached: load_s 1.7 s for MiniLM, vs 6.2 s on transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from taskrun.pipelines.device import cpu_threads, require_cpu_float32
from taskrun.pipelines.text.engine import TextEncoderEngine, max_seq_length, pad_rows
from taskrun.pipelines.text.onnx_export import GRAPH, ensure_exported, read_info
from taskrun.tasks.base import ModelCard, TaskError


class OrtTextEncoder(TextEncoderEngine):
    """A sentence encoder's ONNX export on ONNX Runtime's CPU provider, float32."""

    runtime = "onnxruntime"

    def __init__(self, card: ModelCard, device: str, dtype: str) -> None:
        require_cpu_float32("the onnxruntime runtime for text encoders", device, dtype, "transformers")
        self.device, self.dtype = "cpu", "float32"
        try:
            import onnxruntime as ort
        except ImportError:
            raise TaskError(
                "the onnxruntime runtime needs the `onnxruntime` package: pip install onnxruntime "
                "(or use --runtime transformers)"
            ) from None
        folder = ensure_exported(card)
        info = read_info(folder)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = cpu_threads()
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3  # its warnings about unused initialisers are not the user's concern
        try:
            self.session = ort.InferenceSession(str(folder / GRAPH), opts, providers=["CPUExecutionProvider"])
            self.tokenizer = _tokenizer(Path(card.path))
        except (OSError, ValueError, json.JSONDecodeError, RuntimeError) as exc:
            raise TaskError(
                f"could not load {card.name} on onnxruntime: {str(exc).splitlines()[0]}; use --runtime transformers"
            ) from None
        self.max_tokens = max_seq_length(Path(card.path), getattr(self.tokenizer, "model_max_length", None))
        self.dim = int(info["dim"])
        self.pooling = info["pooling"]
        self._pad = self.tokenizer.pad_token_id or 0
        # Batches of at most 1,024 padded tokens: 1.1-1.2x batches of 64 texts on 2,000 mixed sentences
        # (2 AVX2 cores); the activations of a batch of long texts otherwise spill out of the caches.
        self.batch_tokens = 1024

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]

    def encode_batch(self, ids: list[list[int]]) -> np.ndarray:
        input_ids, mask = pad_rows(ids, self._pad)
        return self.session.run(None, {"input_ids": input_ids, "attention_mask": mask})[0].astype(
            np.float32, copy=False
        )


def _tokenizer(path: Path):
    """The folder's fast tokenizer. Where it has a tokenizer.json, that file on the `tokenizers`
    library itself (_JsonTokenizer): the same ids as transformers' PreTrainedTokenizerFast, which
    runs the same file, without importing transformers (0.7 s of a cold `run embed`'s 1.3 s);
    AutoTokenizer otherwise."""
    if (path / "tokenizer.json").exists():
        return _JsonTokenizer(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


class _JsonTokenizer:
    """What this engine asks of a tokenizer (``__call__`` → input_ids, ``model_max_length``,
    ``pad_token_id``) from tokenizer.json and tokenizer_config.json, as PreTrainedTokenizerFast
    reads them: special tokens added by the file's post-processor, no truncation, no padding."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        self._tok.no_truncation()
        self._tok.no_padding()
        config = {}
        if (path / "tokenizer_config.json").exists():
            config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
        self.model_max_length = config.get("model_max_length")
        pad = config.get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        self.pad_token_id = self._tok.token_to_id(pad) if pad else None

    def __call__(self, texts: list[str], add_special_tokens: bool = True, truncation: bool = False) -> dict:
        """Token ids of ``texts``, never truncated (the engine cuts a long text itself)."""
        return {"input_ids": [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)]}
