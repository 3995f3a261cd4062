"""What classify and detect on transformers share: the dtype they choose, and the model's own
image processor, network and label names, each loaded once per (model, device, dtype)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from taskrun.pipelines import cached_model
from taskrun.pipelines.device import auto_dtype, resolve_dtype
from taskrun.tasks.base import TaskError


class HFVision(NamedTuple):
    torch_dtype: Any
    dtype: str
    processor: Any
    model: Any
    id2label: dict[int, str]


def load_processor(path: str):
    """The model's image processor. Without torchvision, transformers falls back to its PIL
    processors, which give the same pixels."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise TaskError(f"{path} has no usable image processor (preprocessor_config.json): {exc}") from None


def load_hf_vision(
    card, device: str, dtype: str, auto_class: str, role: str, check_processor: Callable[[Any], None] | None = None
) -> HFVision:
    """The processor, then (once ``check_processor`` accepts it) the ``auto_class`` network in
    eval mode, cached under ``role``."""
    import transformers

    # float32 unless asked: bf16 has not been checked against each hub model's accuracy.
    torch_dtype, dtype = resolve_dtype(dtype, device, auto_dtype(device, prefer_bf16=False))
    processor = cached_model(card, "transformers", device, dtype, "image-processor", lambda: load_processor(card.path))
    if check_processor is not None:
        check_processor(processor)
    auto = getattr(transformers, auto_class)
    model = cached_model(
        card,
        "transformers",
        device,
        dtype,
        role,
        lambda: auto.from_pretrained(card.path, dtype=torch_dtype).to(device).eval(),
    )
    id2label = {int(k): v for k, v in (model.config.id2label or {}).items()}
    return HFVision(torch_dtype, dtype, processor, model, id2label)


def processor_fit(processor: Any) -> int | None:
    """The least both sides of a picture need to be for ``processor``'s own resize to lose
    nothing (tasks/image_files.load_image's ``fit``): a fixed height×width is squeezed to (ViT),
    or a shortest edge (ResNet, DETR; divided by ConvNeXt's crop_pct, which resizes past it
    before cropping). None, so the picture is decoded as it is, for a processor that does not
    resize or whose size this does not know."""
    size = getattr(processor, "size", None)
    if size is None or not getattr(processor, "do_resize", True):
        return None

    def get(key: str):  # a plain dict in older transformers, a SizeDict in newer
        return size.get(key) if isinstance(size, dict) else getattr(size, key, None)

    if get("height") and get("width"):
        return int(max(get("height"), get("width")))
    if get("shortest_edge"):
        crop = getattr(processor, "crop_pct", None) or 1.0
        return int(-(-get("shortest_edge") // min(crop, 1.0)))
    return None
