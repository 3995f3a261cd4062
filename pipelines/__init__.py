"""HOW each task runs, in family subpackages: text, llm, speech, vision, diffusion.

``RUNTIMES`` below is the one table of what runs where: a row per (task, runtime) names the
pipeline class that holds the task's logic and, for the families built on an engine interface
(text encoders, language models, speech), the engine it drives. The contract test runs every row.

Loaded models are cached in-process by (model digest, runtime, device, dtype), so a chain or a
batch that uses one model twice reads its weights once. Importing this module must not import
torch: the CLI and `run models` go through it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from taskrun.tasks.base import ModelCard, TaskError


@dataclass(frozen=True)
class Runtime:
    """One row of the table: "module:Class" of the pipeline, and of its engine where it has one."""

    pipeline: str
    engine: str | None = None


_P = "taskrun.pipelines."

RUNTIMES: dict[tuple[str, str], Runtime] = {
    ("embed", "transformers"): Runtime(_P + "text.embed:EmbedPipeline",
                                       engine=_P + "text.hf_encoder:HFTextEncoder"),
    ("search", "transformers"): Runtime(_P + "text.search:SearchPipeline",
                                        engine=_P + "text.hf_encoder:HFTextEncoder"),
    ("classify", "transformers"): Runtime(_P + "text.classify:ClassifyPipeline",
                                          engine=_P + "text.hf_encoder:HFTextEncoder"),
    ("classify", "torch"): Runtime(_P + "vision.efficientnet:EfficientNetPipeline"),
    ("detect", "torch"): Runtime(_P + "vision.faces:FacePipeline"),
    ("detect", "transformers"): Runtime(_P + "vision.hf_detect:DetectPipeline"),
    ("transcribe", "ctranslate2"): Runtime(_P + "speech.transcribe:TranscribePipeline",
                                           engine=_P + "speech.ct2_engine:CT2WhisperEngine"),
    ("transcribe", "transformers"): Runtime(_P + "speech.transcribe:TranscribePipeline",
                                            engine=_P + "speech.hf_engine:HFSpeechEngine"),
    ("generate", "transformers"): Runtime(_P + "llm.generate:GeneratePipeline",
                                          engine=_P + "llm.hf_engine:TransformersLLM"),
    ("summarize", "transformers"): Runtime(_P + "llm.summarize:SummarizePipeline",
                                           engine=_P + "llm.hf_engine:TransformersLLM"),
    ("image", "diffusers"): Runtime(_P + "diffusion.image:DiffusionPipeline"),
}

_MODELS: dict[tuple, Any] = {}


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
        raise TaskError(f"{spec.split(':')[-1]} needs the Python package `{exc.name}`: "
                        f"pip install {exc.name}") from None
    return getattr(module, attr)


def load_pipeline(task: str, card: ModelCard, runtime: str, device: str, dtype: str):
    """A ready Pipeline for ``task`` on ``card``; the weights come from the cache when loaded before."""
    row = RUNTIMES.get((task, runtime))
    if row is None:
        raise TaskError(f"{task} has no {runtime} runtime; it runs on: {', '.join(runtimes_for(task))}")
    if runtime not in card.runtimes:
        raise TaskError(f"`{card.name}` runs on {', '.join(card.runtimes)}, not {runtime}; "
                        f"pick one of those with --runtime")
    cls = load_symbol(row.pipeline)
    if row.engine is None:
        return cls(card, device=device, dtype=dtype)
    return cls(card, device=device, dtype=dtype, engine=load_symbol(row.engine))


def cached_model(card: ModelCard, runtime: str, device: str, dtype: str, role: str,
                 factory: Callable[[], Any]) -> Any:
    """Load once per (model, runtime, device, dtype, role); ``role`` separates e.g. a model and its
    tokenizer, or two heads of one checkpoint."""
    key = (card.digest, card.path, runtime, device, dtype, role)
    if key not in _MODELS:
        _MODELS[key] = factory()
    return _MODELS[key]


def clear_cache() -> None:
    _MODELS.clear()
