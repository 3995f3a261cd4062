"""The ``judge`` check's scorer: cosine similarity of the answer's and the reference's sentence
embeddings, by an embed job on the judge model (default: the packaged MiniLM). The model loads
once (the in-process model cache); judge jobs are not logged, as they are not attempts."""

from __future__ import annotations

import threading

DEFAULT_JUDGE = "minilm"


def make_judge(model: str = DEFAULT_JUDGE):
    """``judge(answer, reference) -> cosine`` in [-1, 1]."""
    lock = threading.Lock()  # --concurrency: one judge job at a time on the shared model

    def judge(answer: str, reference: str) -> float:
        from taskrun.runner.inputs import options_from
        from taskrun.runner.jobs import run_job
        from taskrun.tasks import get_task
        from taskrun.tasks.base import Input

        task = get_task("embed")
        texts = [answer.strip() or " ", reference]
        with lock:
            rec = run_job(
                task,
                lambda: [Input(source=f"judge {i}", kind="text", text=t) for i, t in enumerate(texts)],
                options_from(task, {"normalize": True}),
                model=model,
            )
        a, b = (r.vector for r in rec.results)
        return float((a * b).sum())

    return judge
