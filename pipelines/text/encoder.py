"""A sentence encoder on transformers: tokenise, forward, mean-pool, L2-normalise.

Shared by embed, search and zero-shot classify, and cached per (model, device, dtype), so a job
that needs it twice loads it once. Matches sentence-transformers' output for mean-pooling models.

Speed on CPU comes from two things measured in benchmarks/bench_embed.py: texts are sorted by
length so each batch pads only to its own longest text, and bf16 weights where the CPU has bf16
matrix units (AMX), with pooling and normalisation in float32.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from taskrun.pipelines import cached_model
from taskrun.pipelines.device import auto_dtype, resolve_device, resolve_dtype
from taskrun.tasks.base import ModelCard, TaskError


class TextEncoder:
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
            raise TaskError(f"could not load {card.name} from {card.path}: {str(exc).splitlines()[0]}; "
                            f"the folder may be corrupt or incomplete: re-install or re-download it") from None
        self.max_length = _max_seq_length(Path(card.path), self.tokenizer)
        self.pooling = _pooling_mode(Path(card.path))
        self.dim = self.model.config.hidden_size
        self._token_types = getattr(self.model.config, "type_vocab_size", 0) > 0
        self._torch = torch

    def encode(self, texts: list[str], batch_size: int = 64, normalize: bool = True
               ) -> tuple[np.ndarray, list[int], list[bool]]:
        """Vectors (float32, in input order), tokens read per text, and whether each was truncated."""
        steps = self.encode_steps(texts, batch_size, normalize)
        while True:
            try:
                next(steps)
            except StopIteration as stop:
                return stop.value

    def encode_steps(self, texts: list[str], batch_size: int = 64, normalize: bool = True):
        """Like ``encode``, but a generator: yields the count of texts done after each batch and
        returns encode's result, so a pipeline can report progress as it goes."""
        torch = self._torch
        # Tokenise once, untruncated: the lengths sort the batches (each pads only to its own
        # longest text) and tell which texts the window cut.
        ids = self.tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]
        truncated = [len(x) > self.max_length for x in ids]
        ids = [x if len(x) <= self.max_length else x[: self.max_length - 1] + x[-1:] for x in ids]
        tokens = [len(x) for x in ids]
        order = sorted(range(len(texts)), key=lambda i: tokens[i], reverse=True)
        pad = self.tokenizer.pad_token_id or 0
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            width = tokens[idx[0]]
            input_ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for j, i in enumerate(idx):
                input_ids[j, : tokens[i]] = torch.tensor(ids[i])
                mask[j, : tokens[i]] = 1
            hidden = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                                token_type_ids=torch.zeros_like(input_ids).to(self.device)
                                if self._token_types else None).last_hidden_state.float()
            m = mask.to(self.device).unsqueeze(-1).float()
            if self.pooling == "cls":
                vec = hidden[:, 0]
            else:
                vec = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
            if normalize:
                vec = torch.nn.functional.normalize(vec, p=2, dim=1)
            out[idx] = vec.cpu().numpy()
            yield min(start + batch_size, len(order))
        return out, tokens, truncated


def _max_seq_length(path: Path, tokenizer) -> int:
    st = path / "sentence_bert_config.json"
    if st.exists():
        try:
            return int(json.loads(st.read_text())["max_seq_length"])
        except (KeyError, ValueError, json.JSONDecodeError):
            pass
    n = getattr(tokenizer, "model_max_length", 512)
    return n if n and n < 100_000 else 512


def _pooling_mode(path: Path) -> str:
    cfg = path / "1_Pooling" / "config.json"
    if cfg.exists():
        try:
            c = json.loads(cfg.read_text())
            if c.get("pooling_mode_cls_token"):
                return "cls"
        except json.JSONDecodeError:
            pass
    return "mean"


def text_encoder(card: ModelCard, device: str, dtype: str) -> TextEncoder:
    return cached_model(card, "transformers", device, dtype, "text-encoder",
                        lambda: TextEncoder(card, device, dtype))
