"""What the image pipelines (classify and detect, every runtime) share: reading images in
batches with per-image failures, progress, timing, and a few model helpers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

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
            raise TaskError(
                f"the torch runtime for {self.task} {self.runs}; `{card.name}` is "
                f"{card.kind or card.architecture}: use --runtime transformers"
            )


def measured_run(
    inputs: list,
    batch_size: int,
    process: Process,
    clock: Clock,
    scope: str,
    Metrics: type,
    prepare: Callable[[Any], Any] | None = None,
    workers: int = 1,
    fit: int | None = None,
) -> Iterator[Any]:
    """run_batches, then ``Done`` with items, items_per_s and latency_s of the pipeline's own
    work; that same time is added to ``clock`` under ``scope``."""
    stats: dict = {}
    yield from run_batches(inputs, batch_size, process, stats, prepare, workers, fit)
    clock.add(scope, stats["seconds"])
    yield ev.Done(rate_metrics(Metrics, stats))


def run_batches(
    inputs: list,
    batch_size: int,
    process: Process,
    stats: dict,
    prepare: Callable[[Any], Any] | None = None,
    workers: int = 1,
    fit: int | None = None,
) -> Iterator[Any]:
    """Decode and process ``inputs`` ``batch_size`` at a time, yielding Item / ItemError / Progress
    in input order.

    A file that cannot be read (or ``prepare``d) becomes an ItemError and the rest of its batch
    goes on. With ``workers`` 1, the next batch is decoded (and passed through ``prepare``, e.g.
    resized to an array) on a pool of one thread per core while the model runs on this one:
    Pillow releases the GIL while it decodes and resizes, so a many-core machine decodes as fast
    as its model runs. With ``workers`` > 1 (a model whose ``process`` may run in
    several threads at once, each on its own share of the cores), that many batches are in
    flight together, each decoded image by image on a pool of one thread per core: no core waits
    for the others at a barrier, so decoding fills the gaps instead of stalling the model.
    ``fit``: the model squeezes each whole picture to fit×fit, so files are decoded no larger
    than that needs (tasks/image_files.load_image).
    ``stats`` receives ``items`` (finished) and ``seconds`` (decode + preprocess + forward +
    postprocess).
    """
    total, ok = len(inputs), 0
    starts = list(range(0, total, batch_size))
    batches = _parallel_batches if workers > 1 else _prefetched_batches

    def load(start: int, size: int) -> tuple[list, list]:
        return _load_batch(inputs, start, size, prepare, fit)

    def work() -> Iterator[Any]:
        nonlocal ok
        for start, bad, outs in batches(inputs, starts, batch_size, process, load, workers):
            yield from bad
            for out in outs:
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


def _prefetched_batches(inputs, starts, size, process, load, workers):
    """(start, errors, outputs) per batch: the model on this thread, the next batch decoding
    meanwhile, image by image on a pool of one thread per core."""
    from concurrent.futures import ThreadPoolExecutor

    from taskrun.pipelines.device import cpu_threads

    with ThreadPoolExecutor(max_workers=cpu_threads(), thread_name_prefix="taskrun-decode") as pool:
        pending = _submit_batch(pool, load, starts[0], size, len(inputs)) if starts else None
        for k, start in enumerate(starts):
            good, bad = _gather(pending)
            if k + 1 < len(starts):
                pending = _submit_batch(pool, load, starts[k + 1], size, len(inputs))
            yield start, bad, _guarded(process, good, inputs) if good else []


def _submit_batch(pool, load, start, size, total) -> list:
    return [pool.submit(load, i, 1) for i in range(start, min(start + size, total))]


def _gather(parts: list) -> tuple[list, list]:
    good, bad = [], []
    for part in parts:
        g, b = part.result()
        good += g
        bad += b
    return good, bad


def _parallel_batches(inputs, starts, size, process, load, workers):
    """(start, errors, outputs) per batch, in order, with ``workers`` batches in flight at once
    (at most ``workers`` + 1 decoded ahead, so a long folder is never held in memory whole)."""
    from concurrent.futures import ThreadPoolExecutor

    from taskrun.pipelines.device import cpu_threads

    # With a core per batch in flight, each batch decodes on its own thread (no hand-offs);
    # with more cores, a pool decodes the images of the batches in flight side by side.
    inline = cpu_threads() <= workers
    decode = None if inline else ThreadPoolExecutor(max_workers=cpu_threads(), thread_name_prefix="taskrun-decode")
    model = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="taskrun-model")

    def one_batch(start):
        if decode is None:
            good, bad = load(start, size)
        else:
            good, bad = _gather(_submit_batch(decode, load, start, size, len(inputs)))
        return start, bad, _guarded(process, good, inputs) if good else []

    pending: list = []
    try:
        pending = [model.submit(one_batch, s) for s in starts[: workers + 1]]
        for k in range(len(starts)):
            done = pending.pop(0).result()
            if k + workers + 1 < len(starts):
                pending.append(model.submit(one_batch, starts[k + workers + 1]))
            yield done
    finally:  # a consumer that stops early (a failed job) must not leave batches running
        for f in pending:
            f.cancel()
        model.shutdown(wait=True)
        if decode is not None:
            decode.shutdown(wait=True)


def _load_batch(inputs: list, start: int, size: int, prepare: Callable[[Any], Any] | None, fit: int | None = None):
    """([(index, image or prepared array)], [ItemError]) for inputs[start:start + size]."""
    good, bad = load_images(inputs[start : start + size], start, fit)
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
