"""A chat answer read as it is written, when tools were asked for: its text passed on at once and
each call as soon as it is complete (tasks/wire/tools.py reads the whole answer the same way).
Used by every door that streams a chat answer: OpenAI's chat completions and Responses, Ollama's
/api/chat. Torch- and web-framework-free.
"""

from __future__ import annotations

import re
from typing import Any

from taskrun.tasks.wire.tools import CLOSE, OPEN, ToolRequest, _openai_call, _parse, bare_calls


class ToolStream:
    """The answer of one choice, read as it is written: text is passed on at once, except the
    few characters that may be the start of ``<tool_call>``; each call is passed on as soon as
    its closing tag is written. What it yields, in order: ``("text", str)`` and ``("call",
    tool_call)`` (OpenAI's shape, as ``ToolRequest.calls`` makes them); the same text and calls
    the unstreamed answer has, less the whitespace ``calls`` strips.

    An answer that begins as a bare JSON call to a known function (``{"name": "weather", …``) is
    held until it ends, then read as ``calls`` reads it; one that begins otherwise streams at once.
    Under a grammar (tool_choice required or named) the whole answer is one call: nothing is
    passed on before it is complete (``close``)."""

    def __init__(self, asked: ToolRequest) -> None:
        self.asked = asked
        self.names = {t["name"] for t in asked.tools}
        self.grammar = asked.choice != "auto"
        self.calls = 0  # the calls passed on so far
        self._buf = ""  # text not yet passed on
        self._inside = False  # within <tool_call>…
        self._space = ""  # whitespace held: passed on only when text follows it
        self._started = False  # some text has been passed on
        self._bare: bool | None = None  # the answer is bare JSON calls (held to the end); None: not yet known

    def feed(self, text: str) -> list[tuple[str, Any]]:
        if self.grammar:
            return []
        self._buf += text
        if self._bare is None:
            self._bare = _bare_start(self._buf, self.names)
        if self._bare is not False:
            return []  # bare calls are read whole, at the end
        out: list[tuple[str, Any]] = []
        while True:
            if not self._inside:
                at = self._buf.find(OPEN)
                if at >= 0:
                    out += self._text(self._buf[:at])
                    self._buf, self._inside = self._buf[at + len(OPEN) :], True
                    continue
                keep = _partial(self._buf, OPEN)
                out += self._text(self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                return out
            at = self._buf.find(CLOSE)
            if at < 0:
                return out
            raw, self._buf, self._inside = self._buf[:at], self._buf[at + len(CLOSE) :], False
            out += self._call(raw)

    def close(self, result) -> list[tuple[str, Any]]:
        """What is left once the answer is complete (``result``: the choice's generate result)."""
        if self.grammar:
            content, calls = self.asked.calls(result)
            self.calls = len(calls)
            return ([("text", content)] if content else []) + [("call", c) for c in calls]
        if self._bare is not False:
            found = bare_calls(self._buf, self.names)
            self._bare = False
            if found:
                self._buf = ""
                self.calls = len(found)
                return [("call", _openai_call(c)) for c in found[: None if self.asked.parallel else 1]]
            out = self.feed("")
        else:
            out = []
        rest, self._buf = self._buf, ""
        if self._inside:  # a call cut short: a call if what was written parses, else text
            self._inside = False
            return out + self._call(rest, cut=True)
        return out + self._text(rest)

    def _call(self, raw: str, cut: bool = False) -> list[tuple[str, Any]]:
        call = _parse(raw.strip(), self.names)
        if call is None:
            return self._text(OPEN + raw + ("" if cut else CLOSE))
        self.calls += 1
        if self.calls > 1 and not self.asked.parallel:
            return []  # one call only: the others are dropped, as the unstreamed answer drops them
        self._space = ""
        return [("call", _openai_call(call))]

    def _text(self, text: str) -> list[tuple[str, Any]]:
        """Text passed on, its whitespace at the ends held: passed on when more text follows,
        dropped before a call and at the end (as ``calls`` strips the text it leaves)."""
        body = text.rstrip()
        if not body:
            if self._started:
                self._space += text
            return []
        if not self._started:
            body = body.lstrip()
        self._started = True
        out, self._space = self._space + body, text[len(text.rstrip()) :]
        return [("text", out)]


def _partial(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a beginning of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


_BARE_START = '{"name":"'


def _bare_start(text: str, names: set[str]) -> bool | None:
    """Whether an answer that begins with ``text`` is a bare JSON call to a known function:
    True, False, or None while it cannot yet be told."""
    body = text.lstrip()
    if body.startswith("`"):
        if "```json".startswith(body.rstrip()):
            return None
        head = re.match(r"```(?:json)?\s*", body)
        if head is None or head.end() == len(body):
            return None if "```json".startswith(body.rstrip()) or head is not None else False
        body = body[head.end() :]
    named = re.match(r'\{\s*"name"\s*:\s*"([^"]*)("?)', body)
    if named is None:  # not yet at the name, or not a call
        return None if _BARE_START.startswith(re.sub(r"\s+", "", body)) else False
    name, closed = named.groups()
    if closed:
        return name in names
    return None if any(n.startswith(name) for n in names) else False
