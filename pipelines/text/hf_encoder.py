"""The text-encoder engine on transformers: AutoModel forward, then mean or CLS pooling.

Matches sentence-transformers' output for its pooling models. bf16 weights where the CPU has bf16
matrix units (AMX), with pooling in float32; measured in benchmarks/bench_embed.py together with the
length-sorted batching of pipelines/text/encoder.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from taskrun.pipelines.device import auto_dtype, resolve_device, resolve_dtype
from taskrun.pipelines.text.engine import TextEncoderEngine, max_seq_length, pad_rows, pooling_mode
from taskrun.tasks.base import ModelCard, TaskError


class HFTextEncoder(TextEncoderEngine):
    """Any transformers AutoModel with a tokenizer; pooling as the folder's sentence-transformers
    config says (mean when it says nothing)."""

    runtime = "transformers"

    def __init__(self, card: ModelCard, device: str, dtype: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.device = resolve_device(device)
        self.torch_dtype, self.dtype = resolve_dtype(dtype, self.device, auto_dtype(self.device, prefer_bf16=True))
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(card.path)
            # On CPU, sentence-length sequences are too short for SDPA's flash kernel to pay:
            # eager attention measured ~4% faster end to end (a fifth of the time is attention).
            attn = {"attn_implementation": "eager"} if self.device == "cpu" else {}
            self.model = AutoModel.from_pretrained(card.path, dtype=self.torch_dtype, **attn).to(self.device).eval()
        except (OSError, ValueError, json.JSONDecodeError) as exc:
            raise TaskError(
                f"could not load {card.name} from {card.path}: {str(exc).splitlines()[0]}; "
                f"the folder may be corrupt or incomplete: re-install or re-download it"
            ) from None
        self.max_tokens = max_seq_length(Path(card.path), getattr(self.tokenizer, "model_max_length", None))
        self.pooling = pooling_mode(Path(card.path))
        # float32 on a CPU: batches of at most 1,024 padded tokens ran 1.1-1.2x batches of 64 texts
        # on 2,000 mixed sentences (2 AVX2 cores); bf16 and GPUs keep whole batches, as measured before.
        self.batch_tokens = 1024 if self.device == "cpu" and self.dtype == "float32" else None
        self.dim = self.model.config.hidden_size
        self._token_types = getattr(self.model.config, "type_vocab_size", 0) > 0
        self._pad = self.tokenizer.pad_token_id or 0
        self._torch = torch

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]

    def encode_batch(self, ids: list[list[int]]) -> np.ndarray:
        torch = self._torch
        ids_np, mask_np = pad_rows(ids, self._pad)
        input_ids, mask = torch.from_numpy(ids_np), torch.from_numpy(mask_np)
        hidden = self.model(
            input_ids=input_ids.to(self.device),
            attention_mask=mask.to(self.device),
            token_type_ids=torch.zeros_like(input_ids).to(self.device) if self._token_types else None,
        ).last_hidden_state.float()
        if self.pooling == "cls":
            vec = hidden[:, 0]
        else:
            m = mask.to(self.device).unsqueeze(-1).float()
            vec = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return vec.cpu().numpy()
