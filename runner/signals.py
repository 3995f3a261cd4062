"""SIGTERM handled like Ctrl-C, and a closed stdout ended quietly.

SIGTERM is what `timeout`, `docker stop`, systemd and CI runners send. Python's default is to die
at once, leaving a job's run-log row ``running`` and its temp files behind. Here it raises
:class:`Terminated` (a KeyboardInterrupt) in the main thread, so the same clean-up as Ctrl-C runs:
the pipeline's generator is closed, the job's row says ``interrupted by SIGTERM``, and the command
exits 143 (128 + 15, what a shell reports for a process SIGTERM ended; Ctrl-C exits 130). A
second SIGTERM during that clean-up kills at once (the default action is back by then).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

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


@contextlib.contextmanager
def held() -> Iterator[None]:
    """SIGTERM and SIGINT held off for the block, then acted on: for steps that must happen
    together or not at all (a batch's lines written and counted in its summary). A signal that
    comes meanwhile is raised again as the block ends, to the handler that was there before, so
    the same clean-up runs one step later. In a thread other than the main one (which cannot set
    handlers) the block runs as it is."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    if threading.current_thread() is not threading.main_thread() or None in previous.values():
        yield  # (None: a handler set outside Python, which could not be put back)
        return
    caught: list[int] = []

    def hold(signum, frame) -> None:
        caught.append(signum)

    for s in previous:
        signal.signal(s, hold)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if caught:
            signal.raise_signal(caught[0])  # its handler runs now, as if the signal came here


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
