"""Reading image files for the vision tasks: one place that turns any file a user may give into an
upright 8-bit RGB picture, or a one-line TaskError that says what is wrong with it.

PIL is imported inside the functions so that importing this module (the CLI does, through the
tasks) stays fast. Nothing here imports torch.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from taskrun.tasks.base import TaskError

# A larger picture is refused before it is decoded: a small compressed file can expand to
# gigabytes of pixels (a "decompression bomb"). 100 megapixels covers every camera in use.
DEFAULT_MAX_PIXELS = 100_000_000


def max_pixels() -> int:
    """The pixel limit: TASKRUN_MAX_PIXELS overrides the default."""
    env = os.environ.get("TASKRUN_MAX_PIXELS", "")
    try:
        return int(env) if env else DEFAULT_MAX_PIXELS
    except ValueError:
        raise TaskError(f"TASKRUN_MAX_PIXELS must be a whole number of pixels (got {env!r})") from None


def probe_image(path: str | Path) -> tuple[int, int]:
    """(width, height) from the header only: refuses empty files, non-images and oversized
    pictures cheaply, before any weights load. Damage later in the file shows up in load_image."""
    p = Path(path)
    if p.stat().st_size == 0:
        raise TaskError(f"{p} is empty (0 bytes); it is not an image")
    with _open(p) as img:
        w, h = img.size
    _check_size(p, w, h)
    return w, h


_PIL_LIMIT = threading.Lock()


def _open(p: Path) -> Any:
    """``Image.open`` (header only) with PIL's own bomb check off: it only warns below twice its
    limit, and _check_size refuses with taskrun's limit instead. The lock keeps PIL's global
    setting consistent when the decode thread and the main thread open files at once."""
    from PIL import Image, UnidentifiedImageError

    with _PIL_LIMIT:
        old = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None
        try:
            return Image.open(p)
        except UnidentifiedImageError:
            raise TaskError(f"{p} is not an image that can be read (PNG, JPEG, GIF, BMP, TIFF, WebP)") from None
        except OSError as exc:
            raise TaskError(f"{p}: cannot open it as an image ({exc})") from None
        except (ValueError, TypeError, EOFError, SyntaxError) as exc:
            # a header PIL recognises but cannot make sense of: a TIFF whose width is not a whole
            # number raises ValueError("Invalid dimensions") from Image.open itself (found by
            # tests/test_fuzz.py)
            raise TaskError(f"{p}: cannot open it as an image, its header is damaged ({exc})") from None
        finally:
            Image.MAX_IMAGE_PIXELS = old


def _check_size(p: Path, w: int, h: int) -> None:
    if w <= 0 or h <= 0:
        raise TaskError(f"{p} has zero size ({w}x{h} pixels)")
    limit = max_pixels()
    if w * h > limit:
        raise TaskError(
            f"{p} is {w}x{h} = {w * h:,} pixels, over the limit of {limit:,} that guards "
            f"against decompression bombs; shrink it, or raise TASKRUN_MAX_PIXELS if you "
            f"trust the file"
        )


# Images are decoded at most this many pixels on their longest side (TASKRUN_DECODE_MAX_SIDE
# overrides): the models look at fewer (EfficientNet 224, DETR 1333), and a 9990x9990 PNG decoded
# whole took 6.1 GB in detect. MTCNN, which can use detail, is given --min-face on the original's
# scale (pipelines/vision/faces.py). Measured on that PNG: peak RSS 0.71 GB at 2048 (1.26 GB at
# 4096). JPEGs are decoded straight at a reduced scale, so their full size never exists in memory.
DEFAULT_DECODE_SIDE = 2048
ORIGINAL_SIZE = "taskrun.original_size"  # Image.info key: the upright size before the reduction


def decode_side() -> int:
    env = os.environ.get("TASKRUN_DECODE_MAX_SIDE", "")
    try:
        side = int(env) if env else DEFAULT_DECODE_SIDE
    except ValueError:
        side = 0
    if side < 64:
        raise TaskError(f"TASKRUN_DECODE_MAX_SIDE must be a whole number of pixels, at least 64 (got {env!r})")
    return side


def load_image(path: str | Path, max_side: int | None = None, fit: int | None = None) -> Any:
    """An upright RGB ``PIL.Image`` for ``path``, at most ``max_side`` (default: decode_side())
    pixels on its longest side, and, with ``fit``, reduced further as long as both sides stay at
    least ``fit`` pixels: for a model that squeezes the whole picture to fit×fit, whatever is
    decoded beyond that is averaged away by its own resize.

    Handles greyscale, palette (with or without transparency), RGBA, CMYK and 16-bit files;
    applies the EXIF orientation, so a phone photo taken sideways is read the way it is shown.
    Transparent pixels are composited onto white (what a viewer shows), not black. A larger
    picture is reduced as it is decoded (JPEG: by the decoder's own 1/2-1/8 scaling, so the full
    size never exists in memory) and its upright original size is kept in
    ``img.info[ORIGINAL_SIZE]`` (``original_scale`` maps coordinates back).
    """
    from PIL import ImageOps

    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise TaskError(f"{p}: cannot read it ({exc.strerror or exc})") from None
    if size == 0:
        raise TaskError(f"{p} is empty (0 bytes); it is not an image")
    img = _open(p)
    _check_size(p, *img.size)
    side = max_side or decode_side()
    stored = img.size
    try:
        if img.format == "JPEG":
            k = side / max(stored)
            if fit and min(stored) >= 2 * fit and min(stored) * k >= fit:
                # Decoded straight at the smallest of the decoder's 1/2-1/8 scales that keeps
                # both sides >= fit: a 12-megapixel phone photo for a 224 model decodes at
                # 504x378 (15 ms instead of 275 ms through the longest-side cap alone).
                img.draft(None, (fit, fit))
            elif k < 1:
                img.draft(None, (max(1, int(stored[0] * k)), max(1, int(stored[1] * k))))
        img.load()
        img = _shrink(img, side, fit)
    except OSError as exc:  # "image file is truncated", broken streams
        raise TaskError(f"{p} is damaged or cut short ({exc}); re-export or re-download it") from None
    except Exception as exc:  # decoders raise SyntaxError, ValueError... for corrupt data
        raise TaskError(f"{p} could not be decoded ({type(exc).__name__}: {exc})") from None
    reduced = img.size
    try:
        img = ImageOps.exif_transpose(img)
    except Exception:  # a malformed EXIF block: the pixels are fine, keep them as stored
        pass
    turned = img.size != reduced
    img = to_rgb(img)
    if reduced != stored:
        img.info[ORIGINAL_SIZE] = stored[::-1] if turned else stored
    return img


def _shrink(img: Any, side: int, fit: int | None = None) -> Any:
    """``img`` with its longest side at most ``side``: an integer box reduction first (cheap, and
    a fair average of every pixel), then a Lanczos resize to the exact size. With ``fit``, the
    box reduction also goes as far as keeps both sides >= fit, and the Lanczos step is left to
    the model's own resize."""
    from PIL import Image

    if fit and min(img.size) >= 2 * fit:
        img = _reducible(img)
        img = img.reduce(max(min(img.size) // fit, -(-max(img.size) // side)))
        if min(img.size) >= fit:
            return img
    if max(img.size) <= side:
        return img
    img = _reducible(img)
    factor = max(img.size) // side
    if factor >= 2:
        img = img.reduce(factor)
    if max(img.size) > side:
        k = side / max(img.size)
        img = img.resize((max(1, round(img.width * k)), max(1, round(img.height * k))), Image.Resampling.LANCZOS)
    return img


def _reducible(img: Any) -> Any:
    """``img`` in a mode PIL's reduce and resize can filter (palette, 1-bit and 16-bit cannot)."""
    if img.mode in ("P", "1") or img.mode.startswith("I;16"):
        wide = "RGBA" if "transparency" in img.info else "RGB"
        img = img.convert({"P": wide, "1": "L"}.get(img.mode, "I"))
    return img


def original_scale(img: Any) -> tuple[float, float]:
    """(sx, sy): multiply coordinates on a decoded image by these to get the original picture's."""
    w, h = img.info.get(ORIGINAL_SIZE, img.size)
    return w / img.width, h / img.height


def to_original(result: Any, img: Any) -> Any:
    """A detect result found on a reduced decode, in the original picture's pixels (its boxes,
    landmarks, width and height)."""
    sx, sy = original_scale(img)
    if (sx, sy) == (1.0, 1.0):
        return result
    result.width, result.height = img.info[ORIGINAL_SIZE]
    for b in result.boxes:
        b.x0, b.x1, b.y0, b.y1 = b.x0 * sx, b.x1 * sx, b.y0 * sy, b.y1 * sy
        if b.landmarks:
            b.landmarks = [[x * sx, y * sy] for x, y in b.landmarks]
    return result


def to_rgb(img: Any) -> Any:
    """Any PIL mode → 8-bit RGB, keeping what the picture looks like."""
    from PIL import Image

    mode = img.mode
    if mode == "RGB":
        return img
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        return _wide_to_rgb(img)
    if mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
        mode = img.mode
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if mode == "CMYK":
        return img.convert("RGB")
    return img.convert("RGB")  # L, 1, YCbCr, LAB, HSV


def _wide_to_rgb(img: Any) -> Any:
    """16-bit or 32-bit greyscale → 8-bit: PIL's own convert clips at 255 (a white picture), so
    scale by the range the values can take instead."""
    import numpy as np
    from PIL import Image

    arr = np.asarray(img).astype(np.float64)
    if img.mode == "F":
        lo, hi = float(arr.min()), float(arr.max())
        arr = (arr - lo) / (hi - lo) * 255 if hi > lo else np.zeros_like(arr)
    else:
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        arr = np.clip(arr, 0, top) * (255.0 / top)
    grey = Image.fromarray(np.round(arr).astype(np.uint8), "L")
    return grey.convert("RGB")


def load_images(inputs: list, start: int = 0, fit: int | None = None) -> tuple[list[tuple[int, Any]], list[Any]]:
    """Load a batch: ([(index, RGB image)], [ItemError]) — one bad file does not stop the rest.

    ``start`` offsets the indexes, for a chunk of a larger batch; ``fit`` as in load_image.
    """
    from taskrun.tasks import events as ev

    good, bad = [], []
    for j, inp in enumerate(inputs):
        try:
            good.append((start + j, load_image(inp.path, fit=fit)))
        except TaskError as exc:
            bad.append(ev.ItemError(start + j, inp.describe(), str(exc)))
        except Exception as exc:  # a decoder or converter failing in a way not foreseen above
            bad.append(ev.ItemError(start + j, inp.describe(), f"{type(exc).__name__}: {exc}"))
    return good, bad
