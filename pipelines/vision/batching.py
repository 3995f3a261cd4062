"""What the image pipelines (classify and detect, every runtime) share: reading images in
batches with per-image failures, progress, timing, and a few tensor helpers."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Iterator

from taskrun.tasks import events as ev
from taskrun.tasks.base import TaskError
from taskrun.tasks.clock import timed
from taskrun.tasks.image_files import load_images

# process(batch of (index, RGB image)) → yields (index, result) or ev.ItemError
Process = Callable[[list[tuple[int, Any]]], Iterable[Any]]


def run_batches(inputs: list, batch_size: int, process: Process, stats: dict,
                prepare: Callable[[Any], Any] | None = None) -> Iterator[Any]:
    """Decode and process ``inputs`` ``batch_size`` at a time, yielding Item / ItemError / Progress.

    A file that cannot be read becomes an ItemError and the rest of its batch goes on. The next
    batch is decoded (and passed through ``prepare``, e.g. resized to an array) on a helper
    thread while the model runs on this one: Pillow releases the GIL while it decodes and
    resizes. ``stats`` receives ``items`` (finished) and ``seconds`` (decode + preprocess +
    forward + postprocess).
    """
    from concurrent.futures import ThreadPoolExecutor

    total, ok = len(inputs), 0
    starts = list(range(0, total, batch_size))

    def load(start):
        good, bad = load_images(inputs[start:start + batch_size], start)
        if prepare is not None:
            good = [(i, prepare(img)) for i, img in good]
        return good, bad

    def work() -> Iterator[Any]:
        nonlocal ok
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskrun-decode") as pool:
            pending = pool.submit(load, starts[0]) if starts else None
            for k, start in enumerate(starts):
                good, bad = pending.result()
                if k + 1 < len(starts):
                    pending = pool.submit(load, starts[k + 1])
                yield from bad
                for out in _guarded(process, good, inputs) if good else ():
                    if isinstance(out, ev.ItemError):
                        yield out
                    else:
                        index, result = out
                        ok += 1
                        yield ev.Item(index, inputs[index].describe(), result)
                yield ev.Progress(min(start + batch_size, total), total, "images")

    # seconds: this pipeline's own work, not the time the runner spends printing each item
    stats["seconds"] = 0.0
    yield from timed(work(), lambda s: stats.__setitem__("seconds", stats["seconds"] + s))
    stats["items"] = ok


def _guarded(process: Process, good: list, inputs: list) -> list:
    """process(good), but a batch that fails is retried one image at a time, so one image the
    model or its processor cannot take fails alone (as an ItemError) and the others finish."""
    try:
        return list(process(good))
    except Exception as exc:
        if len(good) == 1:
            if os.environ.get("TASKRUN_DEBUG", "") not in ("", "0"):
                raise  # the traceback, for whoever is debugging the model or this code
            index = good[0][0]
            message = str(exc) if isinstance(exc, TaskError) else f"{type(exc).__name__}: {exc}"
            return [ev.ItemError(index, inputs[index].describe(), message)]
    return [out for item in good for out in _guarded(process, [item], inputs)]


def rate_metrics(Metrics: type, stats: dict) -> Any:
    """items, items_per_s and latency_s from run_batches' stats."""
    n, s = stats.get("items", 0), stats.get("seconds", 0.0)
    return Metrics(items=n, items_per_s=n / s if s > 0 else 0.0, latency_s=s / n if n else 0.0)


def best_cpu_layout(model: Any, device: str) -> Any:
    """channels_last for conv nets: oneDNN's convolutions are faster in NHWC on CPU."""
    import torch

    return model.to(memory_format=torch.channels_last) if device == "cpu" else model


def annotate_item(index: int, image: Any, result: Any, options: Any, several: bool, inputs: list) -> Any:
    """(index, result) for a detect result, with the drawing written when --annotate asks for one;
    a failed write fails that item only."""
    if not options.annotate:
        return index, result
    from taskrun.tasks.detect import annotate, annotation_path

    source = inputs[index].describe()
    out = annotation_path(options.annotate, source, index, several)
    try:
        result.annotated = annotate(image, result, out)
    except (OSError, TaskError) as exc:
        return ev.ItemError(index, source, f"cannot write the annotated image {out}: {exc}")
    return index, result
