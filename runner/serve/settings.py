"""What the operator chose when starting `run serve`: one frozen object the app is built from."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from taskrun.tasks.base import TaskError

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    preload: tuple[str, ...] = ()
    api_key: str | None = None  # None: no key needed (loopback, or --no-auth)
    allowed_origins: tuple[str, ...] = ()  # web page origins beyond loopback ones (patterns with *)
    more_keys: tuple[str, ...] = ()  # further keys (--api-key repeated), each its own tenant
    prompt_cache: str = "tenant"  # cached prompt prefixes shared per key ("tenant"), by all ("shared"), or "off"
    max_queue: int = 16  # requests waiting per model, beyond the one running
    parallel: int = (
        0  # llama.cpp generate sequences decoded together per model (0: chosen from memory; 1: one at a time)
    )
    max_body_bytes: int = 25 * 1024 * 1024  # OpenAI's own audio upload limit
    corpora: dict[str, str] = field(default_factory=dict)  # search corpus NAME → folder
    batching: bool = True  # dynamic batching of concurrent embeddings requests
    batch_window_s: float = 0.005
    batch_max_texts: int = 256
    log_db: str | None = None  # run log (None: $TASKRUN_LOG_DB or the default)
    device: str = "auto"
    dtype: str = "auto"
    read_timeout_s: float = 10.0  # whole headers, and the longest pause in a body (runner/serve/connections.py)
    max_connections: int = 2048  # open at once; beyond, the longest-stalled one is closed
    client_runtimes: bool = False  # whether a request's "runtime" may differ from the model's


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str | None, no_auth: bool) -> None:
    """Binding an address other machines can reach needs a key, or --no-auth typed on purpose."""
    if api_key and no_auth:
        raise TaskError("--api-key and --no-auth contradict each other; give one")
    if not is_loopback(host) and not api_key and not no_auth:
        raise TaskError(
            f"--host {host} lets other machines reach this server; give --api-key KEY "
            f"(or TASKRUN_API_KEY), or --no-auth to serve without one on purpose"
        )


def parse_origins(values: tuple[str, ...]) -> tuple[str, ...]:
    """``--allowed-origins`` (repeatable, or comma-separated as in TASKRUN_ORIGINS) → patterns."""
    out = tuple(v.strip() for value in values for v in value.split(",") if v.strip())
    for origin in out:
        if origin != "*" and "://" not in origin:
            raise TaskError(f"--allowed-origins {origin}: give an origin such as https://example.com (or * for any)")
    return out


def parse_corpora(values: tuple[str, ...]) -> dict[str, str]:
    """``NAME=DIR`` pairs → {name: folder}; a request names a corpus, never a path."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep or not name or not folder:
            raise TaskError(f"--corpus {value}: give NAME=DIR, e.g. --corpus docs=./docs")
        if not Path(folder).exists():
            raise TaskError(f"--corpus {value}: {folder} does not exist")
        if name in out:
            raise TaskError(f"--corpus {name} is given twice")
        out[name] = str(Path(folder).resolve())
    return out


def parse_size(value: str | None) -> int | None:
    """``--max-memory``: '8GB', '512MiB', '2g' or a byte count → bytes (None for no limit); the one
    size parser, models/sizes.py."""
    from taskrun.models.sizes import parse_size as parse

    return parse(value, "--max-memory") if value else None
