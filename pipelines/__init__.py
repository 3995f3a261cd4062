"""HOW each task runs, in family subpackages: text, llm, speech, vision, diffusion.

``RUNTIMES`` below is the one table of what runs where: a row per (task, runtime) names the
pipeline class that holds the task's logic and, for the families built on an engine interface
(text encoders, language models, speech), the engine it drives. The contract test runs every row.

Loaded models are cached in-process by (model digest, runtime, device, dtype), so a chain, a batch
or a server that uses one model twice reads its weights once (see "The model cache" below).
Importing this module must not import torch: the CLI and `run models` go through it.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import threading
import time
import types
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taskrun.tasks.base import ModelCard, TaskError

# onnxruntime (faster-whisper's VAD, the language detector) otherwise writes a device id and a
# telemetry database under ~/.cache/Microsoft/DeveloperTools on every session it creates: state
# in the user's home that taskrun never announced. Set ORT_DISABLE_TELEMETRY=0 to allow it.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

__all__ = [
    "RUNTIMES",
    "Runtime",
    "cache_info",
    "cached_model",
    "clear_cache",
    "unload",
    "load_pipeline",
    "load_symbol",
    "memory_budget",
    "runtimes_for",
    "set_memory_budget",
]


@dataclass(frozen=True)
class Runtime:
    """One row of the table: "module:Class" of the pipeline, and of its engine where it has one."""

    pipeline: str
    engine: str | None = None


_P = "taskrun.pipelines."

RUNTIMES: dict[tuple[str, str], Runtime] = {
    ("embed", "transformers"): Runtime(_P + "text.embed:EmbedPipeline", engine=_P + "text.hf_encoder:HFTextEncoder"),
    ("search", "transformers"): Runtime(_P + "text.search:SearchPipeline", engine=_P + "text.hf_encoder:HFTextEncoder"),
    ("classify", "transformers"): Runtime(
        _P + "text.classify:ClassifyPipeline", engine=_P + "text.hf_encoder:HFTextEncoder"
    ),
    # Sentence encoders exported once to ONNX (pipelines/text/onnx_export.py): the default on a CPU
    # without bf16 units, where it runs 1.4x transformers float32 (pipelines/text/encoder.py: auto_runtime).
    ("embed", "onnxruntime"): Runtime(_P + "text.embed:EmbedPipeline", engine=_P + "text.ort_encoder:OrtTextEncoder"),
    ("search", "onnxruntime"): Runtime(
        _P + "text.search:SearchPipeline", engine=_P + "text.ort_encoder:OrtTextEncoder"
    ),
    ("classify", "torch"): Runtime(_P + "vision.efficientnet:EfficientNetPipeline"),
    # an image EfficientNet's ONNX export, or zero-shot text on a sentence encoder's (text.classify)
    ("classify", "onnxruntime"): Runtime(
        _P + "text.classify:OrtClassifyPipeline", engine=_P + "text.ort_encoder:OrtTextEncoder"
    ),
    ("detect", "torch"): Runtime(_P + "vision.faces:FacePipeline"),
    ("detect", "transformers"): Runtime(_P + "vision.hf_detect:DetectPipeline"),
    ("transcribe", "ctranslate2"): Runtime(
        _P + "speech.transcribe:TranscribePipeline", engine=_P + "speech.ct2_engine:CT2WhisperEngine"
    ),
    ("transcribe", "transformers"): Runtime(
        _P + "speech.transcribe:TranscribePipeline", engine=_P + "speech.hf_engine:HFSpeechEngine"
    ),
    ("generate", "transformers"): Runtime(
        _P + "llm.generate:GeneratePipeline", engine=_P + "llm.hf_engine:TransformersLLM"
    ),
    ("summarize", "transformers"): Runtime(
        _P + "llm.summarize:SummarizePipeline", engine=_P + "llm.hf_engine:TransformersLLM"
    ),
    # GGUF language models, their quantised weights read as stored (pipelines/llm/llamacpp.py);
    # the default runtime for a GGUF where llama-cpp-python is installed (models/resolve.py).
    ("generate", "llama.cpp"): Runtime(_P + "llm.generate:GeneratePipeline", engine=_P + "llm.llamacpp:LlamaCppEngine"),
    ("summarize", "llama.cpp"): Runtime(
        _P + "llm.summarize:SummarizePipeline", engine=_P + "llm.llamacpp:LlamaCppEngine"
    ),
    ("image", "diffusers"): Runtime(_P + "diffusion.image:DiffusionPipeline"),
}


def runtimes_for(task: str) -> list[str]:
    return [rt for (t, rt) in RUNTIMES if t == task]


def load_symbol(spec: str) -> Any:
    """The object named by "package.module:Name"; a missing dependency names the package to install."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):  # the module itself: a wrong table row
            raise
        raise TaskError(
            f"{spec.split(':')[-1]} needs the Python package `{exc.name}`: pip install {exc.name}"
        ) from None
    return getattr(module, attr)


def load_pipeline(task: str, card: ModelCard, runtime: str, device: str, dtype: str):
    """A ready Pipeline for ``task`` on ``card``; the weights come from the cache when loaded before."""
    row = RUNTIMES.get((task, runtime))
    if row is None:
        raise TaskError(f"{task} has no {runtime} runtime; it runs on: {', '.join(runtimes_for(task))}")
    if runtime not in card.runtimes:
        raise TaskError(
            f"`{card.name}` runs on {', '.join(card.runtimes)}, not {runtime}; pick one of those with --runtime"
        )
    cls = load_symbol(row.pipeline)
    if row.engine is None:
        return cls(card, device=device, dtype=dtype)
    return cls(card, device=device, dtype=dtype, engine=load_symbol(row.engine))


# --------------------------------------------------------------------------- the model cache
# The in-process model cache: loaded weights stay warm between jobs, under a memory budget.
#
# A chain or a batch that uses one model twice reads its weights once; a server (``run serve``)
# keeps every model it has served warm until the budget (``--max-memory``) needs the room, then
# unloads the least recently used first. Jobs run in worker threads there, so the cache is
# thread-safe: two concurrent requests for one model load it once (the second waits on a lock of
# that key alone), loads run one at a time (see _LOAD_LOCK), and jobs on warm models never wait.
#
# Sizes are measured from what was loaded: the bytes of the torch parameters and buffers that an
# entry holds (engines and pipelines hold their modules as attributes). A model none of whose
# entries holds torch modules (CTranslate2, ONNX) counts as its card's size on disk. A model's
# tokenizer or processor is a separate entry of the same model and adds no bytes of its own.
#
# Torch is never imported here: an object can only hold torch modules once torch is imported.

Key = tuple  # (digest, path, runtime, device, dtype, role)


@dataclass
class Entry:
    """One loaded object (a model, its tokenizer, a whole pipeline) and what the budget knows of it."""

    value: Any
    card: ModelCard
    runtime: str
    device: str
    dtype: str
    role: str
    torch_bytes: int
    last_used: float

    @property
    def group(self) -> tuple:
        """The load of one model on one runtime/device/dtype; its roles share its weights' budget."""
        return self.card.digest, self.card.path, self.runtime, self.device, self.dtype


_LOCK = threading.Lock()  # guards the tables below; never held while a model loads
# Loads themselves run one at a time in a process: transformers and diffusers switch process-wide
# state while they build a model (weight initialisation off, the meta device), so two loads in two
# threads break each other ("Cannot copy out of meta tensor"). Reentrant: a factory may load a
# tokenizer through the cache. Jobs on models already loaded never take it.
_LOAD_LOCK = threading.RLock()
_MODELS: OrderedDict[Key, Entry] = OrderedDict()  # least recently used first
_LOADING: dict[Key, threading.Lock] = {}  # one lock per key being loaded
_BUDGET: list[int | None] = [None]  # bytes; None: no limit


def cached_model(card: ModelCard, runtime: str, device: str, dtype: str, role: str, factory: Callable[[], Any]) -> Any:
    """Load once per (model, runtime, device, dtype, role); ``role`` separates e.g. a model and its
    tokenizer, or two heads of one checkpoint. Each use marks the entry most recently used."""
    key = (card.digest, card.path, runtime, device, dtype, role)
    with _LOCK:
        hit = _touch(key, card)
        if hit is not None:
            return hit
        key_lock = _LOADING.setdefault(key, threading.Lock())
    with key_lock:  # a second caller for this key waits here for the first one's load
        try:
            with _LOCK:
                hit = _touch(key, card)
                if hit is not None:
                    return hit
                dropped = _stale(card) + _make_room(_expected_bytes(card, runtime, device, dtype), keep=None)
            _release(dropped)  # unload before loading: the two never need to fit together
            with _LOAD_LOCK:
                value = factory()
            entry = Entry(value, card, runtime, device, dtype, role, torch_bytes(value), time.time())
            with _LOCK:
                _MODELS[key] = entry
                dropped = _make_room(0, keep=key)
            _release(dropped)
            return value
        finally:
            with _LOCK:
                if _LOADING.get(key) is key_lock:
                    del _LOADING[key]


def _touch(key: Key, card: ModelCard | None = None) -> Any | None:
    entry = _MODELS.get(key)
    if entry is None:
        return None
    _MODELS.move_to_end(key)
    entry.last_used = time.time()
    if card is not None and "ran" in entry.card.extra:  # a warm model ran the same converted copy:
        card.extra.setdefault("ran", entry.card.extra["ran"])  # the run log's note says so again
    return entry.value


def _stale(card: ModelCard) -> list[Entry]:
    """Remove the entries loaded from ``card``'s path when its bytes were different (the file was
    replaced or damaged on disk since): what they hold is no longer what that path is."""
    stale = [k for k, e in _MODELS.items() if e.card.path == card.path and e.card.digest != card.digest]
    return [_MODELS.pop(k) for k in stale]


def _expected_bytes(card: ModelCard, runtime: str, device: str, dtype: str) -> int:
    """What loading this entry will add: nothing when its model is already loaded (another role),
    else the card's size on disk, the best guess before the weights are read."""
    group = (card.digest, card.path, runtime, device, dtype)
    return 0 if any(e.group == group for e in _MODELS.values()) else int(card.size_bytes or 0)


def _make_room(incoming: int, keep: Key | None) -> list[Entry]:
    """Remove least recently used entries until the cache plus ``incoming`` bytes fits the
    budget (``keep``, the entry just loaded, is never removed). Returns what was removed, to be
    released outside the lock. A model larger than the whole budget still loads: it is the one
    the job needs, and everything else makes way for it."""
    budget = _BUDGET[0]
    dropped: list[Entry] = []
    while budget is not None and _used_bytes() + incoming > budget:
        victim = next((k for k in _MODELS if k != keep), None)
        if victim is None:
            break
        dropped.append(_MODELS.pop(victim))
    return dropped


def _release(dropped: list[Entry]) -> None:
    """Let go of unloaded entries: the memory returns once no running job still holds them."""
    if not dropped:
        return
    dropped.clear()
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def entry_bytes() -> dict[Key, int]:
    """Each entry's share of memory. An entry counts its torch bytes; a model whose entries hold
    no torch modules counts its card's size once, on its oldest entry."""
    with_torch = {e.group for e in _MODELS.values() if e.torch_bytes}
    counted: set[tuple] = set()
    out = {}
    for key, e in _MODELS.items():
        if e.torch_bytes or e.group in with_torch or e.group in counted:
            out[key] = e.torch_bytes
        else:
            out[key] = int(e.card.size_bytes or 0)
            counted.add(e.group)
    return out


def _used_bytes() -> int:
    return sum(entry_bytes().values())


def torch_bytes(obj: Any, depth: int = 3) -> int:
    """Bytes of the torch parameters and buffers ``obj`` is or holds (as attributes, in dicts,
    lists or tuples, ``depth`` levels down); each tensor's storage counted once (tied weights)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    seen: set[int] = set()
    total = 0
    for module in _modules(obj, torch.nn.Module, depth, set()):
        for t in list(module.parameters()) + list(module.buffers()):
            ptr = t.data_ptr() if t.device.type != "meta" else id(t)
            if ptr not in seen:
                seen.add(ptr)
                total += t.numel() * t.element_size()
    return total


def _modules(obj: Any, module_cls: type, depth: int, visited: set[int]):
    if id(obj) in visited or depth < 0:
        return
    visited.add(id(obj))
    if isinstance(obj, module_cls):
        yield obj
        return
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        children = list(obj)
    else:
        children = list(getattr(obj, "__dict__", {}).values())
    for child in children:
        # Python modules are not weights (and walking torch's trips its deprecation warnings).
        if isinstance(child, (str, bytes, int, float, bool, type(None), types.ModuleType, type)):
            continue
        yield from _modules(child, module_cls, depth - 1, visited)


def set_memory_budget(max_bytes: int | None) -> None:
    """Keep at most ``max_bytes`` of models loaded (None: no limit). Lowering it unloads the least
    recently used models at once."""
    if max_bytes is not None and max_bytes <= 0:
        raise ValueError(f"the memory budget must be a positive number of bytes or None (got {max_bytes})")
    with _LOCK:
        _BUDGET[0] = max_bytes
        dropped = _make_room(0, keep=None)
    _release(dropped)


def memory_budget() -> int | None:
    return _BUDGET[0]


def cache_info() -> list[dict]:
    """The loaded entries, least recently used first: model, runtime, device, dtype, role, bytes
    (as counted against the budget) and last_used (Unix time)."""
    with _LOCK:
        sizes = entry_bytes()
        return [
            {
                "model": e.card.name,
                "digest": e.card.digest,
                "runtime": e.runtime,
                "device": e.device,
                "dtype": e.dtype,
                "role": e.role,
                "bytes": sizes[k],
                "last_used": e.last_used,
            }
            for k, e in _MODELS.items()
        ]


def unload(digest: str) -> int:
    """Unload every entry of the model with these weights (Ollama's ``keep_alive: 0``); how many."""
    with _LOCK:
        keys = [k for k, e in _MODELS.items() if e.card.digest == digest]
        dropped = [_MODELS.pop(k) for k in keys]
    _release(dropped)
    return len(keys)


def clear_cache() -> None:
    """Unload every model."""
    with _LOCK:
        dropped = list(_MODELS.values())
        _MODELS.clear()
    _release(dropped)
