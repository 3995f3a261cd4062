"""What the image pipelines (classify and detect, every runtime) share: reading images in
batches with per-image failures, progress, timing, and a few model helpers."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Iterator

from taskrun.pipelines.base import Pipeline as Base
from taskrun.tasks import events as ev
from taskrun.tasks.base import TaskError
from taskrun.tasks.clock import Clock, timed
from taskrun.tasks.image_files import load_images

# process(batch of (index, RGB image)) → yields (index, result) or ev.ItemError
Process = Callable[[list[tuple[int, Any]]], Iterable[Any]]


class TorchVision(Base):
    """The plain-torch vision runtimes: each runs one network family, and refuses a model of
    another kind before its weights load (the transformers runtime takes the rest)."""

    runtime = "torch"
    kind = ""  # the model card kind this pipeline runs
    runs = ""  # what it runs, for the refusal: "runs the MTCNN face detector"

    def __init__(self, card, device="auto", dtype="auto"):
        super().__init__(card, device, dtype)
        if card.kind != self.kind:
            raise TaskError(f"the torch runtime for {self.task} {self.runs}; `{card.name}` is "
                            f"{card.kind or card.architecture}: use --runtime transformers")


def measured_run(inputs: list, batch_size: int, process: Process, clock: Clock, scope: str,
                 Metrics: type, prepare: Callable[[Any], Any] | None = None) -> Iterator[Any]:
    """run_batches, then ``Done`` with items, items_per_s and latency_s of the pipeline's own
    work; that same time is added to ``clock`` under ``scope``."""
    stats: dict = {}
    yield from run_batches(inputs, batch_size, process, stats, prepare)
    clock.add(scope, stats["seconds"])
    yield ev.Done(rate_metrics(Metrics, stats))


def run_batches(inputs: list, batch_size: int, process: Process, stats: dict,
                prepare: Callable[[Any], Any] | None = None) -> Iterator[Any]:
    """Decode and process ``inputs`` ``batch_size`` at a time, yielding Item / ItemError / Progress.

    A file that cannot be read (or ``prepare``d) becomes an ItemError and the rest of its batch
    goes on. The next batch is decoded (and passed through ``prepare``, e.g. resized to an
    array) on a helper thread while the model runs on this one: Pillow releases the GIL while it
    decodes and resizes. ``stats`` receives ``items`` (finished) and ``seconds`` (decode +
    preprocess + forward + postprocess).
    """
    from concurrent.futures import ThreadPoolExecutor

    total, ok = len(inputs), 0
    starts = list(range(0, total, batch_size))

    def work() -> Iterator[Any]:
        nonlocal ok
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskrun-decode") as pool:
            pending = pool.submit(_load_batch, inputs, starts[0], batch_size, prepare) if starts else None
            for k, start in enumerate(starts):
                good, bad = pending.result()
                if k + 1 < len(starts):
                    pending = pool.submit(_load_batch, inputs, starts[k + 1], batch_size, prepare)
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


def _load_batch(inputs: list, start: int, size: int, prepare: Callable[[Any], Any] | None):
    """([(index, image or prepared array)], [ItemError]) for inputs[start:start + size]."""
    good, bad = load_images(inputs[start:start + size], start)
    if prepare is None:
        return good, bad
    prepared = []
    for index, img in good:
        try:
            prepared.append((index, prepare(img)))
        except Exception as exc:
            bad.append(_item_error(index, inputs, exc))
    return prepared, bad


def _guarded(process: Process, good: list, inputs: list) -> list:
    """process(good), but a batch that fails is retried one image at a time, so one image the
    model or its processor cannot take fails alone (as an ItemError) and the others finish."""
    try:
        return list(process(good))
    except Exception as exc:
        if len(good) == 1:
            return [_item_error(good[0][0], inputs, exc)]
    return [out for item in good for out in _guarded(process, [item], inputs)]


def _item_error(index: int, inputs: list, exc: Exception) -> ev.ItemError:
    """One image's failure as its ItemError; TASKRUN_DEBUG re-raises it instead, with the
    traceback, for whoever is debugging the model or this code."""
    if os.environ.get("TASKRUN_DEBUG", "") not in ("", "0"):
        raise exc
    message = str(exc) if isinstance(exc, TaskError) else f"{type(exc).__name__}: {exc}"
    return ev.ItemError(index, inputs[index].describe(), message)


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
