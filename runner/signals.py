"""SIGTERM handled like Ctrl-C, and a closed stdout ended quietly.

SIGTERM is what `timeout`, `docker stop`, systemd and CI runners send. Python's default is to die
at once, leaving a job's run-log row ``running`` and its temp files behind. Here it raises
:class:`Terminated` (a KeyboardInterrupt) in the main thread, so the same clean-up as Ctrl-C runs:
the pipeline's generator is closed, the job's row says ``interrupted by SIGTERM``, and the command
exits 143 (128 + 15, what a shell reports for a process SIGTERM ended; Ctrl-C exits 130). A
second SIGTERM during that clean-up kills at once (the default action is back by then).
"""

from __future__ import annotations

import io
import os
import signal
import sys
from collections.abc import Callable

EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM; caught where KeyboardInterrupt is."""


def _on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated()


def handle_sigterm() -> Callable[[], None]:
    """Install the handler (main thread only) → a function that puts the previous one back."""
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: the host program owns its signals
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, previous)


def exit_code(exc: KeyboardInterrupt) -> int:
    return EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT


def stdout_gone() -> None:
    """The reader of stdout left (`| head -1`). Whatever is still buffered would fail again when
    Python flushes at exit ("Exception ignored ... BrokenPipeError", exit 120), so stdout now
    goes to /dev/null."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, io.UnsupportedOperation):  # a stdout without a file (tests)
        pass
