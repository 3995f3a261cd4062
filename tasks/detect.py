"""detect: an image → boxes, each with a label, a score and corners in pixels of the original image."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from taskrun.tasks.base import (
    Input,
    ModelCard,
    Task,
    TaskError,
    atomic_write,
    check_input_kind,
    check_model_serves,
    metric,
    option,
    require,
)

FACE_KINDS = {"face-detection"}
ANNOTATE_SUFFIXES = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP", ".bmp": "BMP"}


@dataclass(frozen=True)
class Options:
    threshold: float = option(
        0.5,
        "-t",
        "--threshold",
        help="Keep boxes whose score is at least this (0-1). MTCNN's own last "
        "stage already needs 0.7, so lower values change nothing there.",
    )
    annotate: str | None = option(
        None,
        "--annotate",
        path=True,
        metavar="OUT.png",
        help="Draw the boxes and labels onto a copy of the image and save it "
        "here (several images: one file each, named after the input).",
    )
    landmarks: bool = option(
        False,
        "--landmarks",
        help="Also return the five face landmarks (eyes, nose, mouth corners); face detectors only.",
    )
    min_face: int = option(20, "--min-face", help="Smallest face to look for, in pixels; face detectors only.")
    batch_size: int = option(8, "--batch-size", help="Images per forward pass.")

    def __post_init__(self):
        require(0.0 <= self.threshold <= 1.0, f"--threshold must be between 0 and 1 (got {self.threshold})")
        require(self.min_face >= 12, f"--min-face must be at least 12 pixels (got {self.min_face})")
        require(self.batch_size > 0, f"--batch-size must be at least 1 (got {self.batch_size})")
        if self.annotate:
            suffix = Path(self.annotate).suffix.lower()
            require(
                suffix in ANNOTATE_SUFFIXES or Path(self.annotate).is_dir(),
                f"--annotate {self.annotate}: name a .png, .jpg or .webp file (or a folder)",
            )


@dataclass
class Box:
    label: str
    score: float
    x0: float  # left, pixels of the original image
    y0: float  # top
    x1: float  # right
    y1: float  # bottom
    landmarks: list[list[float]] | None = None  # [[x, y] × 5] for faces with --landmarks


@dataclass
class Result:
    input: str
    width: int  # of the original image (after EXIF orientation)
    height: int
    boxes: list[Box] = field(default_factory=list)  # best score first
    annotated: str | None = None  # the file --annotate wrote

    def summary(self) -> str:
        labels: dict[str, int] = {}
        for b in self.boxes:
            labels[b.label] = labels.get(b.label, 0) + 1
        return ", ".join(f"{n} {lab}" for lab, n in labels.items()) or "nothing found"


@dataclass
class Metrics:
    items: int = metric("images processed", 0)
    items_per_s: float = metric("items ÷ time in decode + preprocess + forward + postprocess (load excluded)")
    latency_s: float = metric("mean time per item, i.e. batch time ÷ items in it")


class DetectTask(Task):
    def check(self, inputs: list[Input], options: Options, card: ModelCard) -> None:
        check_model_serves(self, card)
        for inp in inputs:
            self.check_input(inp)
        if card.kind not in FACE_KINDS:
            what = f"`{card.name}` is an {card.kind or 'object-detection'} model"
            if options.landmarks:
                raise TaskError(f"--landmarks needs a face detector; {what}. Leave out --model to use mtcnn")
            if options.min_face != 20:
                raise TaskError(f"--min-face applies to face detectors only; {what}; leave it out")
        if options.annotate:
            parent = Path(options.annotate).resolve().parent
            if not Path(options.annotate).is_dir() and not parent.is_dir():
                raise TaskError(f"--annotate {options.annotate}: folder {parent} does not exist; create it first")

    def check_input(self, inp: Input) -> None:
        check_input_kind(self, inp)
        from taskrun.tasks.image_files import probe_image

        if inp.path:
            probe_image(inp.path)  # a non-image or a decompression bomb is refused before weights load

    def render(self, result: Result, options) -> str:
        lines = [f"{result.input}  {result.width}x{result.height}  {result.summary()}"]
        for b in result.boxes:
            lines.append(f"  {b.score:6.3f}  {b.label:<12} [{b.x0:.0f}, {b.y0:.0f}, {b.x1:.0f}, {b.y1:.0f}]")
            if b.landmarks:
                lines.append("          landmarks " + " ".join(f"({x:.0f},{y:.0f})" for x, y in b.landmarks))
        if result.annotated:
            lines.append(f"  → {result.annotated}")
        return "\n".join(lines)


def annotation_path(target: str, source: str, index: int, several: bool) -> Path:
    """Where --annotate writes one image's drawing: the path itself for one image; for several,
    the input's name is added so no image overwrites another."""
    t = Path(target)
    stem = Path(source).stem or f"image{index + 1}"
    if t.is_dir():
        return t / f"{stem}.annotated.png"
    if not several:
        return t
    return t.with_name(f"{t.stem}-{index + 1}-{stem}{t.suffix}")


def annotate(image, result: Result, out: Path) -> str:
    """Draw ``result``'s boxes, labels and landmarks on a copy of ``image`` and save it atomically."""
    import io

    from PIL import ImageDraw, ImageFont

    from taskrun.tasks.image_files import original_scale

    canvas = image.copy()
    draw = ImageDraw.Draw(canvas)
    sx, sy = original_scale(image)  # boxes are in the original's pixels; the image may be reduced
    if (sx, sy) != (1.0, 1.0):
        result = Result(
            result.input,
            canvas.width,
            canvas.height,
            [
                Box(
                    b.label,
                    b.score,
                    b.x0 / sx,
                    b.y0 / sy,
                    b.x1 / sx,
                    b.y1 / sy,
                    [[x / sx, y / sy] for x, y in b.landmarks] if b.landmarks else None,
                )
                for b in result.boxes
            ],
        )
    side = max(canvas.size)
    width = max(2, side // 300)
    try:
        font = ImageFont.load_default(size=max(12, side // 50))
    except TypeError:  # Pillow < 10.1 has one fixed-size default font
        font = ImageFont.load_default()
    palette = [(230, 25, 75), (60, 180, 75), (0, 130, 200), (245, 130, 48), (145, 30, 180), (70, 240, 240)]
    colours: dict[str, tuple] = {}
    for b in result.boxes:
        colour = colours.setdefault(b.label, palette[len(colours) % len(palette)])
        draw.rectangle([b.x0, b.y0, b.x1, b.y1], outline=colour, width=width)
        text = f"{b.label} {b.score:.2f}"
        tx0, ty0, tx1, ty1 = draw.textbbox((0, 0), text, font=font)
        th = ty1 - ty0 + 2 * width
        top = b.y0 - th if b.y0 - th >= 0 else b.y0
        draw.rectangle([b.x0, top, b.x0 + tx1 - tx0 + 2 * width, top + th], fill=colour)
        draw.text((b.x0 + width, top + width - ty0), text, fill=(255, 255, 255), font=font)
        for x, y in b.landmarks or []:
            r = width + 1
            draw.ellipse([x - r, y - r, x + r, y + r], fill=colour)
    buf = io.BytesIO()
    fmt = ANNOTATE_SUFFIXES.get(out.suffix.lower(), "PNG")
    canvas.save(buf, format=fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    atomic_write(out, buf.getvalue())
    return str(out)


TASK = DetectTask(
    name="detect",
    summary="Find objects (or faces) in images: boxes with labels and scores.",
    takes="image files or folders (PNG, JPEG, GIF, BMP, TIFF, WebP)",
    returns="per image, boxes with label, score and x0, y0, x1, y1 in original pixels (--annotate draws them)",
    Options=Options,
    Result=Result,
    Metrics=Metrics,
    input_kinds=("image",),
    model_kinds="an object or face detector such as mtcnn, or any *ForObjectDetection model (DETR, YOLOS)",
)
