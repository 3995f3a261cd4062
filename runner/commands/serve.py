"""`run serve`: the click command. Checks the operator's choices, sets the threads, starts uvicorn."""

from __future__ import annotations

import logging
import os
import signal
import sys

import click

from taskrun.tasks.base import TaskError


def physical_cores() -> int:
    """Physical cores this process may use: hyper-threads share one core's matrix units, and a
    second thread per core slows torch's matrix work rather than speeding it."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/core_cpus_list") as f:
                cores.add(f.read().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


@click.command("serve")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Any address other than loopback needs --api-key or --no-auth.",
)
@click.option("--port", default=8080, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--preload",
    multiple=True,
    metavar="MODEL",
    help="Load this model at start-up; /health answers 200 only once all are loaded. Repeatable.",
)
@click.option(
    "--api-key",
    envvar="TASKRUN_API_KEY",
    metavar="KEY",
    multiple=True,
    help="Require 'Authorization: Bearer KEY' on every request but GET /health [env TASKRUN_API_KEY]. "
    "Repeatable: each key is a tenant of its own (see --prompt-cache).",
)
@click.option(
    "--prompt-cache",
    type=click.Choice(["tenant", "shared", "off"]),
    default="tenant",
    show_default=True,
    help="llama.cpp prompt prefixes reused within one API key (tenant), by every client (shared), "
    "or never (off); cached_tokens never counts another tenant's prefix.",
)
@click.option(
    "--allowed-origins",
    multiple=True,
    envvar="TASKRUN_ORIGINS",
    metavar="ORIGIN",
    help="Web page origins (e.g. https://app.example.com, * as a wildcard) that may call this "
    "server besides loopback ones; others get 403, as does a Host that is not this server's "
    "(DNS rebinding). Repeatable or comma-separated [env TASKRUN_ORIGINS].",
)
@click.option("--no-auth", is_flag=True, help="Serve a non-loopback address without a key, on purpose.")
@click.option(
    "--max-queue",
    default=16,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Requests that may wait per model; beyond that, 503 with Retry-After.",
)
@click.option(
    "--parallel",
    default=0,
    type=click.IntRange(0, 64),
    metavar="N",
    help="Generate requests on one llama.cpp model decoded together in one batch, at most N "
    "(0, the default: up to 4, fewer if their KV caches would not fit in memory; 1: one at a "
    "time). Beyond N they wait in the queue.",
)
@click.option(
    "--max-body-mb",
    default=25.0,
    show_default=True,
    type=click.FloatRange(0.001, 4096),
    help="Largest request body in MB (OpenAI's audio upload limit is 25).",
)
@click.option(
    "--read-timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.1, 3600),
    metavar="SECONDS",
    help="Time a client has to send whole request headers, and the longest pause allowed in a "
    "body; a stalled connection is closed.",
)
@click.option(
    "--max-connections",
    default=2048,
    show_default=True,
    type=click.IntRange(8, 1_000_000),
    help="Open connections at once; beyond, the one stalled longest is closed (else 503).",
)
@click.option(
    "--max-memory",
    metavar="SIZE",
    help="Memory budget for loaded models (e.g. 8GB); the least recently used is unloaded "
    "to make room; a SIZE below the smallest installed model is refused. Default: no limit.",
)
@click.option(
    "--client-runtimes",
    is_flag=True,
    help='Let requests choose a model\'s runtime ("runtime": ...), which may convert the model '
    "and take its memory on the server. Default: the model's runtime only.",
)
@click.option(
    "--corpus",
    "corpora",
    multiple=True,
    metavar="NAME=DIR",
    help="A folder that search requests may name by NAME (clients never name paths). Repeatable.",
)
@click.option(
    "--threads",
    type=click.IntRange(1, 1024),
    metavar="N",
    help="Torch threads for each job (default: the physical cores).",
)
@click.option(
    "--no-batching",
    is_flag=True,
    help="Run each embeddings request as its own job (default: concurrent ones are merged).",
)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N, mps.")
@click.option(
    "--dtype",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    help="Weights/compute dtype.",
)
@click.option(
    "--log-db",
    type=click.Path(dir_okay=False),
    envvar="TASKRUN_LOG_DB",
    help="Run log SQLite file [env TASKRUN_LOG_DB]; every request's job is a row.",
)
def serve_cmd(threads, max_memory, **choices):
    """Serve every task over HTTP from one warm process: OpenAI- and Ollama-compatible endpoints,
    POST /v1/tasks/TASK for every task, /health and /metrics.

    \b
    Security defaults:
      - listens on 127.0.0.1 only; another --host needs --api-key KEY (or an
        explicit --no-auth); keys are compared in constant time
      - request bodies over --max-body-mb (25 MB) are refused with 413 before
        they are read; prompts, texts, image count, size and steps are limited
      - clients never name paths on this machine: files travel inline or as
        uploads (sniffed by content), search corpora are the --corpus NAMEs,
        models are the names GET /v1/models lists
      - errors answer OpenAI's {"error": {...}} shape; tracebacks stay in
        this terminal, never in a response

    \b
    Threads: torch uses --threads intra-op threads (default: the physical
    cores) and OpenMP waits passively. Jobs of one model run one at a time,
    but generate requests on a llama.cpp model, which share one batch
    (--parallel); different models run side by side and share the cores.
    """
    from taskrun.runner.serve.settings import parse_size

    try:
        settings, budget = _settings(**choices), parse_size(max_memory)
    except TaskError as exc:
        raise click.UsageError(str(exc)) from None
    if budget is not None:
        _check_budget(budget, max_memory)
    _set_threads(threads or physical_cores())
    if budget is not None:
        _set_budget(budget)
    _run(settings)


def _settings(
    host,
    port,
    preload,
    api_key,
    allowed_origins,
    no_auth,
    max_queue,
    max_body_mb,
    read_timeout,
    max_connections,
    corpora,
    no_batching,
    device,
    dtype,
    log_db,
    prompt_cache,
    parallel,
    client_runtimes=False,
):
    """The operator's choices, checked, as the server's Settings (TaskError names a bad one)."""
    from taskrun.runner.serve.settings import Settings, check_exposure, parse_corpora, parse_origins

    keys = tuple(k for k in api_key if k)
    check_exposure(host, keys[0] if keys else None, no_auth)
    return Settings(
        host=host,
        port=port,
        preload=tuple(preload),
        api_key=keys[0] if keys else None,
        more_keys=keys[1:],
        prompt_cache=prompt_cache,
        allowed_origins=parse_origins(allowed_origins),
        parallel=parallel,
        max_queue=max_queue,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
        read_timeout_s=read_timeout,
        max_connections=max_connections,
        corpora=parse_corpora(corpora),
        batching=not no_batching,
        log_db=log_db,
        device=device,
        dtype=dtype,
        client_runtimes=client_runtimes,
    )


def _set_threads(n: int) -> None:
    """Before any runtime loads: TASKRUN_THREADS is what pipelines/device.py gives torch when it
    first loads a model (and CTranslate2 its own pool); OpenMP waits passively. Torch itself is
    imported by the first job or --preload, not here, so an idle server starts in a second."""
    os.environ["TASKRUN_THREADS"] = str(n)
    from taskrun.pipelines.device import configure_openmp

    configure_openmp()


def smallest_model() -> tuple[str, int] | None:
    """The packaged model with the fewest bytes on disk here (name, bytes); None when none is
    installed. Models joined from parts are not joined for this (they are large ones)."""
    from taskrun.models.digest import dir_size
    from taskrun.models.resolve import aliases, locate

    found = []
    for name, entry in aliases().items():
        if "join" in entry:
            continue
        try:
            found.append((dir_size(locate(name, offline=True)[0]), name))
        except (TaskError, OSError):
            continue
    return (min(found)[1], min(found)[0]) if found else None


def _check_budget(budget: int, given: str) -> None:
    """A budget no model fits would load every model anyway and thrash: refuse it, naming the
    least that holds one (a model takes about its size on disk once loaded)."""
    from taskrun.models.sizes import format_size

    smallest = smallest_model()
    if smallest and budget < smallest[1]:
        name, size = smallest
        raise click.UsageError(
            f"--max-memory {given} is below the size of every model here; the smallest, {name}, "
            f"takes {format_size(size)}: give at least --max-memory {-(-size // 10**6)}MB, "
            f"or leave it out for no limit"
        )


def _set_budget(budget: int) -> None:
    from taskrun import pipelines

    setter = getattr(pipelines, "set_memory_budget", None)
    if setter is None:
        raise click.UsageError("--max-memory needs a taskrun with a model memory budget (pipelines.set_memory_budget)")
    setter(budget)


def _run(settings) -> None:
    import uvicorn

    from taskrun.runner.serve.sweep import sweep_uploads

    sweep_uploads()  # what servers killed with -9 left in the temp folder

    from taskrun.runner.serve.app import create_app
    from taskrun.runner.serve.connections import guarded_protocol, raise_open_files

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sock = _bind(settings.host, settings.port)
    app = create_app(settings)
    where = f"http://{settings.host}:{settings.port}"
    click.echo(
        f"taskrun serving on {where} (threads {os.environ['TASKRUN_THREADS']}, "
        f"{'key required' if settings.api_key else 'no key'})",
        err=True,
    )
    conns = raise_open_files(settings.max_connections)
    protocol = guarded_protocol(settings.read_timeout_s, conns, settings.max_body_bytes)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=protocol,
        backlog=max(2048, conns),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = _server_class()(config)
    server.run(sockets=[sock])
    if server.signal == signal.SIGTERM:
        sys.exit(143)  # 128 + 15, as runner/signals.py exits for every other command


def _server_class():
    import uvicorn

    from taskrun.runner.serve.workers import STOPPING

    class Server(uvicorn.Server):
        """uvicorn's, noting the signal and stopping running jobs at once: each ends at its next
        token or step as "interrupted by SIGTERM", and its stream with an error line."""

        signal: int | None = None

        def handle_exit(self, sig, frame) -> None:
            self.signal = self.signal or sig
            STOPPING.set()
            # sse-starlette patches handle_exit to cut every event stream at once, racing the job's
            # own end: its "server_shutting_down" line was lost about one time in three. Streams end
            # with their job now (at its next token), and uvicorn's graceful timeout bounds the wait.
            from sse_starlette.sse import AppStatus

            AppStatus.enable_automatic_graceful_drain = False
            (AppStatus.original_handler or uvicorn.Server.handle_exit)(self, sig, frame)

    return Server


def _bind(host: str, port: int):
    """The listening socket, bound before "serving on" is said: a busy port is a clear error."""
    import errno
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise click.ClickException(
                f"port {port} on {host} is in use (another server?): stop it, or pass --port with a free one"
            ) from None
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock
