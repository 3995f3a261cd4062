"""What a diffusers model folder takes, read from its config files (no torch, no weights).

``image``'s check uses this to refuse a prompt to a model that takes no text, a label to a text
model, a size the model cannot take or guidance it cannot apply, all before anything loads; the
pipeline uses the same answers to run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from taskrun.tasks.base import TaskError

DIGIT_WORDS = "zero one two three four five six seven eight nine".split()


@dataclass(frozen=True)
class ModelConditioning:
    kind: str  # "text" (a prompt), "class" (a label) or "none" (unconditional)
    labels: tuple[str, ...] = ()  # class names, in class-index order
    aliases: tuple[tuple[str, str], ...] = ()  # extra words for a label: ("seven", "7")
    null_class: int | None = None  # the "no class" index that classifier-free guidance needs
    cfg: bool = False  # can mix conditional and unconditional predictions (--guidance)
    factor: int = 8  # width and height must be multiples of this (VAE or UNet downsampling)
    native: tuple[int, int] = (512, 512)  # (width, height) the model was trained at
    default_steps: int = 50
    default_guidance: float | None = None

    def takes(self) -> str:
        if self.kind == "text":
            return "a text prompt (no --label)"
        if self.kind == "class":
            return f"a class label: --label {'|'.join(self.labels)}, or a prompt naming one"
        return "no prompt and no label (it is unconditional; run it with no input)"

    def label_index(self, label: str) -> int:
        if label in self.labels:
            return self.labels.index(label)
        raise TaskError(f"this model has no label '{label}'; it takes --label {', '.join(self.labels)}")

    def label_from_prompt(self, prompt: str) -> str:
        """The one class a prompt names, as a whole word (a label or an alias such as "seven").

        "a handwritten 7" → "7"; "seven" → "7"; a prompt naming no class, or two different ones,
        is refused with the labels listed.
        """
        words = set(re.findall(r"[\w-]+", prompt.lower()))
        names = {lab.lower(): lab for lab in self.labels} | {a.lower(): lab for a, lab in self.aliases}
        found = sorted({lab for w, lab in names.items() if w in words}, key=self.labels.index)
        if len(found) == 1:
            return found[0]
        what = "names no class" if not found else f"names {len(found)} classes ({', '.join(found)})"
        raise TaskError(
            f"the prompt {prompt!r} {what}; this class-conditional model draws one of: "
            f'{", ".join(self.labels)}. Name one (e.g. "a handwritten {self.labels[-1]}") '
            f"or use --label"
        )


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError) as exc:
        raise TaskError(f"{path} is not valid JSON ({exc}); the model folder looks corrupt") from None


def read_conditioning(path: str | Path) -> ModelConditioning:
    """What the diffusers folder at ``path`` takes, from model_index.json and its parts' configs."""
    root = Path(path)
    if not (root / "model_index.json").exists():
        raise TaskError(
            f"{root} is not a diffusers model folder (no model_index.json); image needs "
            f"a diffusers pipeline folder or hub id"
        )
    index = _json(root / "model_index.json")
    denoiser = "unet" if index.get("unet") else "transformer"
    dcfg = _json(root / denoiser / "config.json")
    vae = _json(root / "vae" / "config.json") if index.get("vae") else {}
    extra = _json(root / "conditioning.json")  # taskrun's own note for class-conditional models
    if vae:
        factor = 2 ** (len(vae.get("block_out_channels", [0] * 4)) - 1)
        side = int(_first(dcfg.get("sample_size", 64)) * factor)
    else:  # pixel-space: the UNet halves the image at each level but the last
        factor = 2 ** (len(dcfg.get("block_out_channels", [0])) - 1)
        side = int(_first(dcfg.get("sample_size", 64)))
    native = (side, side)
    steps = int(extra.get("default_steps", 50))
    if index.get("text_encoder") and index["text_encoder"][0] is not None:
        # Guidance-distilled models (LCM) embed the scale instead of mixing two predictions.
        cfg = not dcfg.get("time_cond_proj_dim")
        return ModelConditioning(
            "text",
            cfg=cfg,
            factor=factor,
            native=native,
            default_steps=steps,
            default_guidance=float(extra.get("default_guidance", 7.5)) if cfg else None,
        )
    n_classes = dcfg.get("num_class_embeds") if denoiser == "unet" else None
    if n_classes:
        null = extra.get("null_class")
        labels = extra.get("labels") or [str(i) for i in range(n_classes - (null is not None))]
        aliases = extra.get("aliases") or (
            {w: str(i) for i, w in enumerate(DIGIT_WORDS)} if labels == [str(i) for i in range(10)] else {}
        )
        return ModelConditioning(
            "class",
            labels=tuple(labels),
            aliases=tuple(aliases.items()),
            null_class=null,
            cfg=null is not None,
            factor=factor,
            native=native,
            default_steps=steps,
            default_guidance=float(extra.get("default_guidance", 1.0)) if null is not None else None,
        )
    return ModelConditioning("none", factor=factor, native=native, default_steps=steps)


def _first(v):
    return v[0] if isinstance(v, (list, tuple)) else v
