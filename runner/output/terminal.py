"""Text shown on a terminal: what comes from inputs (file names, texts, model output) must not
drive the terminal, and what comes from a user must not flood it."""

from __future__ import annotations

# C0 and C1 control characters but newline and tab: what a terminal would act on (colours, cursor
# moves, title changes, clearing the screen) if a file name or a text carried them.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x09, 0x0A)}


def for_terminal(text: str, limit: int | None = None) -> str:
    """``text`` as it may be shown on a terminal: control characters escaped (``\\x1b``), and with
    ``limit``, cut to that many characters with a note of how many were left out. Used for text
    output and messages; --json and files keep the exact text."""
    text = str(text)
    if limit is not None and len(text) > limit:
        text = f"{text[:limit]}… ({len(text) - limit:,} more characters)"
    return text.translate(_CONTROLS)
