"""Prometheus metrics, in a registry of the app's own (two apps in one process never collide).

Per endpoint: requests and errors by status. Per task and model: latency and queue wait
histograms, and each task's own numbers from its Metrics (time to first token, decode tokens/s,
real-time factor, seconds per denoising step, ...) as histograms, so a dashboard shows their
distribution and not only the last value.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RATE = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)
RATIO = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)
SEQUENCES = (1, 2, 3, 4, 6, 8, 16, 32, 64)  # sequences (or prompts) in one llama_decode of a batch

# A task's own metrics exported as histograms: metric name → (help, buckets).
TASK_METRICS: dict[str, tuple[str, tuple]] = {
    "load_s": ("resolution and loading of the weights (≈0 when warm)", LATENCY),
    "ttft_s": ("generate/summarize: job start → first token", LATENCY),
    "prefill_s": ("generate/summarize: forward pass over the prompt", LATENCY),
    "decode_tokens_per_s": ("generate/summarize: tokens after the first ÷ their time", RATE),
    "rtf": ("transcribe: processing time ÷ audio length", RATIO),
    "s_per_step": ("image: denoising seconds per step", LATENCY),
    "items_per_s": ("embed/classify/detect/search: items per second of compute", RATE),
    "output_tokens": ("generate/summarize: tokens generated per job", (1, 8, 32, 128, 512, 2048, 8192)),
}


class ServerMetrics:
    """The server's metrics; ``text()`` is the body of GET /metrics."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("taskrun_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.errors = Counter(
            "taskrun_request_errors", "requests answered with a 4xx or 5xx", ["endpoint", "status", "code"], registry=r
        )
        self.jobs = Counter("taskrun_jobs", "jobs run, by outcome", ["task", "model", "status"], registry=r)
        self.latency = Histogram(
            "taskrun_job_latency_seconds",
            "job wall time, queue wait excluded",
            ["task", "model"],
            buckets=LATENCY,
            registry=r,
        )
        self.queue_wait = Histogram(
            "taskrun_queue_wait_seconds",
            "time a job waited for its model's thread",
            ["task", "model"],
            buckets=LATENCY,
            registry=r,
        )
        self.queue_depth = Gauge("taskrun_queue_depth", "jobs waiting or running, per model", ["model"], registry=r)
        self.batch_size = Histogram(
            "taskrun_embed_batch_requests",
            "requests merged into one embeddings job",
            ["model"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r,
        )
        # continuous batching of llama.cpp generate jobs (pipelines/llm/llamacpp_batch.py)
        self.batch_running = Gauge(
            "taskrun_batch_running_sequences", "sequences in a model's batch (prefill or decode)", ["model"], registry=r
        )
        self.batch_waiting = Gauge(
            "taskrun_batch_waiting_requests", "generate requests waiting to join a model's batch", ["model"], registry=r
        )
        self.batch_now = Gauge("taskrun_batch_size", "sequences in the last batched decode step", ["model"], registry=r)
        self.batch_steps = Histogram(
            "taskrun_batch_step_sequences",
            "sequences decoded together per decode step",
            ["model"],
            buckets=SEQUENCES,
            registry=r,
        )
        self.batch_prompts = Histogram(
            "taskrun_batch_prompt_pass_prompts",
            "prompts read together per batch step that reads prompts (its count: those steps; a prompt read "
            "on a small model's float16 copy is read outside the steps and not counted)",
            ["model"],
            buckets=SEQUENCES,
            registry=r,
        )
        self.task = {
            name: Histogram(f"taskrun_task_{name}", doc, ["task", "model"], buckets=b, registry=r)
            for name, (doc, b) in TASK_METRICS.items()
        }

    def request(self, endpoint: str, status: int, code: str | None = None) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        if status >= 400:
            self.errors.labels(endpoint, str(status), code or "").inc()

    def job(self, task: str, model: str, status: str, queue_wait_s: float | None, rec=None) -> None:
        """One finished (or failed) job: its outcome, wait, and its task's numbers."""
        self.jobs.labels(task, model, status).inc()
        if queue_wait_s is not None:
            self.queue_wait.labels(task, model).observe(queue_wait_s)
        if rec is None:
            return
        self.latency.labels(task, model).observe(rec.wall_s)
        if rec.metrics is None:
            return
        for name, value in rec.metrics_dict().items():
            if name in self.task and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.task[name].labels(task, model).observe(value)

    def text(self, depth: dict[str, int], batches: dict[str, tuple[int, int, int]] | None = None) -> bytes:
        return self.exposition(depth, "", batches)[0]

    def exposition(
        self, depth: dict[str, int], accept: str, batches: dict[str, tuple[int, int, int]] | None = None
    ) -> tuple[bytes, str]:
        """(the metrics, their Content-Type) for the scraper's Accept header: OpenMetrics when it
        asks for it, else the text format, version 0.0.4 (what Prometheus parses)."""
        from prometheus_client.exposition import choose_encoder

        for model, n in depth.items():
            self.queue_depth.labels(model).set(n)
        for model, (running, waiting, size) in (batches or {}).items():
            self.batch_running.labels(model).set(running)
            self.batch_waiting.labels(model).set(waiting)
            self.batch_now.labels(model).set(size)
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
