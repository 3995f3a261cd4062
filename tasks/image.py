"""image: a prompt (or a class label, or nothing) → PNG images, made by diffusion step by step.

The PNGs carry their settings in text chunks (prompt, negative, seed, steps, scheduler, guidance,
size, model and digest), so any image can be made again from its own file.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskrun.tasks.base import Task, TaskError, atomic_write, check_model_serves, internal, metric, option, require
from taskrun.tasks.image_conditioning import ModelConditioning, read_conditioning

SCHEDULERS = ("default", "ddim", "ddpm", "euler", "euler-a", "dpm++", "pndm", "lms", "heun", "unipc")
NATIVE_TIMES = 4  # the largest --size per side, in multiples of the model's native size
MAX_PIXELS = 2048 * 2048  # a sane limit: beyond it a CPU (or most GPUs) cannot finish a job
MAX_IMAGES = 64


def parse_size(size: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*", size)
    if not m:
        raise TaskError(f"--size takes WIDTHxHEIGHT such as 512x512 (got {size!r})")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class Options:
    steps: int | None = option(
        None, "--steps", help="Denoising steps (default: the model's; 25 for digits-ddpm, 50 for text-to-image models)."
    )
    seed: int | None = option(
        None, "--seed", help="Random seed; image i of -n uses seed+i. Default: a random one, recorded in the PNG."
    )
    size: str | None = option(
        None,
        "--size",
        metavar="WxH",
        help="Image size, a multiple of the model's VAE factor (default: the model's native size).",
    )
    guidance: float | None = option(
        None, "--guidance", help="Classifier-free guidance scale (models that support it; default: the model's)."
    )
    negative: str = option(
        "", "--negative", help="Negative prompt: what to steer away from (text-to-image models with guidance)."
    )
    scheduler: str = option(
        "default", "--scheduler", choices=SCHEDULERS, help="Sampler; 'default' keeps the model's own."
    )
    n: int = option(1, "-n", help="How many images to make (seeds seed, seed+1, …).")
    label: str | None = option(None, "--label", help="Class to draw, for class-conditional models (digits-ddpm: 0-9).")
    out_dir: str = option(
        ".", "--out-dir", path=True, metavar="DIR", help="Folder for the images when -o is not given."
    )

    def __post_init__(self):
        require(self.steps is None or 1 <= self.steps <= 1000, f"--steps must be between 1 and 1000 (got {self.steps})")
        require(1 <= self.n <= MAX_IMAGES, f"-n must be between 1 and {MAX_IMAGES} (got {self.n})")
        require(self.seed is None or 0 <= self.seed < 2**63, f"--seed must be ≥ 0 (got {self.seed})")
        require(
            self.guidance is None or 0 <= self.guidance <= 50,
            f"--guidance must be between 0 and 50 (got {self.guidance}); 1 means no guidance",
        )
        if self.size is not None:
            w, h = parse_size(self.size)
            require(
                w > 0 and h > 0 and w * h <= MAX_PIXELS,
                f"--size {self.size} is out of range; use at most {MAX_PIXELS} pixels "
                f"(e.g. 1024x1024), each side at least 1",
            )
        require(Path(self.out_dir).is_dir(), f"--out-dir {self.out_dir} does not exist; create it first")


@dataclass
class Image:
    """One generated image: its seed, its files once written, and its pixels (not in JSON)."""

    seed: int
    files: list[str] = field(default_factory=list)
    pixels: Any = internal()  # numpy uint8 (height, width, channels)


@dataclass
class Generation:
    """The images of one job and every setting needed to make them again."""

    prompt: str | None
    label: str | None
    negative: str
    steps: int
    scheduler: str
    guidance: float | None
    width: int
    height: int
    model: str
    model_digest: str
    images: list[Image] = field(default_factory=list)

    def summary(self) -> str:
        what = repr(self.prompt) if self.prompt else f"label {self.label}" if self.label else "unconditional"
        files = ", ".join(f for im in self.images for f in im.files)
        return f"{len(self.images)} image(s) {self.width}x{self.height} {what}" + (f" → {files}" if files else "")

    def png_text(self, image: Image) -> dict[str, str]:
        """The settings stored in each PNG's text chunks; read back with ``read_png_settings``."""
        text = {
            "prompt": self.prompt or "",
            "negative": self.negative,
            "label": self.label or "",
            "seed": str(image.seed),
            "steps": str(self.steps),
            "scheduler": self.scheduler,
            "guidance": "" if self.guidance is None else repr(self.guidance),
            "size": f"{self.width}x{self.height}",
            "model": self.model,
            "model_digest": self.model_digest,
            "software": "taskrun",
        }
        return text


Result = Generation


@dataclass
class Metrics:
    images: int = metric("images made", 0)
    steps: int = metric("denoising steps per image batch", 0)
    s_per_step: float = metric("denoising loop time ÷ steps (the loop only: no conditioning, no decode)")
    encode_s: float = metric("prompt or label conditioning, up to the first denoising step")
    decode_s: float = metric("latents → pixels, from the last denoising step to the images")
    images_per_s: float = metric("images ÷ (encode + denoising loop + decode)")
    compile_s: float = metric(
        "tracing the denoiser for this batch shape: once per shape per process, from its second job on; 0 otherwise"
    )
    width: int = metric("image width in pixels", 0)
    height: int = metric("image height in pixels", 0)


def png_bytes(pixels, text: dict[str, str]) -> bytes:
    import io

    from PIL import Image as PILImage
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for k, v in text.items():
        info.add_itxt(k, v)  # iTXt: UTF-8, so any prompt round-trips
    arr = pixels[..., 0] if pixels.ndim == 3 and pixels.shape[2] == 1 else pixels
    buf = io.BytesIO()
    PILImage.fromarray(arr).save(buf, format="PNG", pnginfo=info)
    return buf.getvalue()


def read_png_settings(path: str | Path) -> dict[str, str]:
    """The settings taskrun stored in a PNG (empty for other PNGs)."""
    from PIL import Image as PILImage

    with PILImage.open(path) as im:
        return dict(getattr(im, "text", {}) or {})


def _slug(gen: Generation) -> str:
    base = gen.prompt or (f"label-{gen.label}" if gen.label else "image")
    return re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")[:40] or "image"


def _targets(gen: Generation, path: Path | None, out_dir: str) -> list[Path]:
    n = len(gen.images)
    if path is not None:
        if n == 1:
            return [path]
        return [path.with_name(f"{path.stem}-{i}{path.suffix or '.png'}") for i in range(1, n + 1)]
    out = []
    for im in gen.images:  # never overwrite an earlier image: add -2, -3, … to the name
        stem = f"{_slug(gen)}-{im.seed}"
        p, k = Path(out_dir) / f"{stem}.png", 2
        while p.exists() or p in out:
            p, k = Path(out_dir) / f"{stem}-{k}.png", k + 1
        out.append(p)
    return out


def save(gen: Generation, path: Path | None, out_dir: str) -> list[str]:
    """Write the job's PNGs: to ``path`` (-o; name-1.png, name-2.png… for several), or into
    ``out_dir`` with names made from the prompt and seed. All are encoded before any is written."""
    targets = _targets(gen, path, out_dir)
    for t in targets:
        if not t.parent.is_dir():
            raise TaskError(f"cannot write {t}: folder {t.parent} does not exist; create it first")
    blobs = [png_bytes(im.pixels, gen.png_text(im)) for im in gen.images]
    for im, t, blob in zip(gen.images, targets, blobs):
        atomic_write(t, blob)
        im.files = [str(t)]
    return [str(t) for t in targets]


class ImageTask(Task):
    def check(self, inputs, options: Options, card) -> None:
        check_model_serves(self, card)
        if len(inputs) > 1:
            raise TaskError(
                f"image takes one prompt per job (got {len(inputs)}); use -n for several images of one prompt"
            )
        for inp in inputs:
            self.check_input(inp)
        cond = read_conditioning(card.path)
        prompt = inputs[0].text if inputs else None
        check_request(cond, card.name, prompt, options)

    def render(self, result: Generation, options: Options) -> str:
        if not any(im.files for im in result.images):
            save(result, None, options.out_dir)
        return "\n".join(f for im in result.images for f in im.files)

    def write(self, items, fmt, path, options) -> str | bytes | None:
        if fmt != "png":
            if fmt == "text":
                return "\n".join(self.render(r, options) for r in items) + "\n"
            return super().write(items, fmt, path, options)
        for gen in items:
            for f in save(gen, path, options.out_dir):
                print(f, file=sys.stdout)
        return None


def check_request(cond: ModelConditioning, name: str, prompt: str | None, options: Options) -> str | None:
    """Refuse what the model cannot take, before loading; return the class label to draw (if any)."""
    label = None
    if cond.kind == "text":
        _check_text(cond, name, prompt, options)
    elif cond.kind == "class":
        label = _class_label(cond, name, prompt, options)
    elif prompt or options.label is not None:
        raise TaskError(f"`{name}` is an unconditional image model: {cond.takes()}")
    if options.guidance is not None and not cond.cfg:
        raise TaskError(f"`{name}` has no classifier-free guidance; drop --guidance")
    if options.negative and not cond.cfg:
        raise TaskError(f"`{name}` has no classifier-free guidance, so --negative has no effect; drop it")
    if options.size is not None:
        _check_size(cond, name, options.size)
    return label


def _check_text(cond: ModelConditioning, name: str, prompt: str | None, options: Options) -> None:
    if options.label is not None:
        raise TaskError(f"--label is for class-conditional models; `{name}` takes {cond.takes()}")
    if not prompt:
        raise TaskError(f'`{name}` is a text-to-image model; give a prompt, e.g. run image "a red fox"')


def _class_label(cond: ModelConditioning, name: str, prompt: str | None, options: Options) -> str:
    """The one class to draw, from --label or a prompt naming it (both must agree)."""
    label = options.label
    if label is not None:
        cond.label_index(label)
    if prompt:
        named = cond.label_from_prompt(prompt)
        if label is not None and named != label:
            raise TaskError(f"the prompt names {named} but --label says {label}; give one of them")
        label = named
    if label is None:
        raise TaskError(
            f"`{name}` is a class-conditional model; say what to draw with --label "
            f"({', '.join(cond.labels)}) or a prompt naming one"
        )
    if options.negative:
        raise TaskError(f"--negative needs a text-to-image model; `{name}` takes {cond.takes()}")
    return label


def _check_size(cond: ModelConditioning, name: str, size: str) -> None:
    w, h = parse_size(size)
    if w % cond.factor or h % cond.factor:
        raise TaskError(
            f"--size {size}: `{name}` needs width and height that are multiples "
            f"of {cond.factor} (its VAE factor), e.g. "
            f"{max(cond.factor, w // cond.factor * cond.factor)}x"
            f"{max(cond.factor, h // cond.factor * cond.factor)}"
        )
    most = (NATIVE_TIMES * cond.native[0], NATIVE_TIMES * cond.native[1])
    if w > most[0] or h > most[1]:
        raise TaskError(
            f"--size {size}: `{name}` makes images of {cond.native[0]}x{cond.native[1]}; ask at most "
            f"{NATIVE_TIMES} times that per side ({most[0]}x{most[1]}): beyond, it draws noise slowly"
        )


TASK = ImageTask(
    name="image",
    summary="Make images by diffusion: a prompt, a class label (--label) or nothing, step by step.",
    takes="an optional prompt (text-to-image models); class-conditional models take --label or a "
    "prompt naming the class; unconditional models take nothing",
    returns="PNG files with their settings in the PNG metadata (-o out.png; out-1.png… for -n > 1; "
    "without -o, named from the prompt and seed in --out-dir)",
    Options=Options,
    Result=Result,
    Metrics=Metrics,
    input_kinds=("text",),
    model_kinds="a diffusers image-generation model such as digits-ddpm, or a text-to-image folder",
    formats=("png", "json", "text"),
    writes_files="png",
    text_file="whole",
    batch=False,
    inputs_required=False,
)
