"""Transcription on an OpenAI-compatible endpoint: the file uploaded as multipart to
``/audio/transcriptions`` (``/audio/translations`` for ``--task translate``), the answer asked for
as ``verbose_json`` with segment (and, with word timestamps, word) times, and read back into
transcribe's own :class:`Segment` and :class:`Word`. Torch-free; httpx. The connection, retries,
errors and key are the chat client's (pipelines/llm/endpoint_client.py).

Ollama has no transcription API: an Ollama endpoint is refused before anything is sent.

Scopes: ``total_s`` is measured at this client (upload sent → answer read, so it holds the
upload, the server's queue and decode, and the answer's way back); ``duration_s``, ``language``
and the times are what the server reported.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from pathlib import Path

from taskrun.tasks.base import TaskError
from taskrun.tasks.transcribe import Segment, Word


@dataclass
class Transcription:
    text: str = ""
    language: str = ""
    duration_s: float | None = None  # the audio's length as the server reported it (None: not given)
    segments: list[Segment] = field(default_factory=list)
    total_s: float = 0.0  # at this client: upload sent → answer read
    retries: int = 0  # attempts repeated after a 429, a 5xx, a refused connection or a timeout
    model: str = ""  # the model name in the answer ("" where the API gives none, as OpenAI's)
    digest: str = ""  # where the endpoint's model listing gives one
    server: dict = field(default_factory=dict)  # what the server reported, in its own scope


def check_transcribe_endpoint(ep) -> None:
    """Before any file is read or sent: only an OpenAI-compatible API transcribes."""
    if ep.api != "openai":
        raise TaskError(
            f"endpoint {ep.name}: Ollama's API has no transcription; give an OpenAI-compatible "
            f"server's URL ending in /v1 (e.g. `run serve`'s http://HOST:PORT/v1), or --endpoint-kind openai"
        )


def transcribe(
    ep,
    path: str,
    *,
    language: str | None = None,
    translate: bool = False,
    words: bool = False,
    prompt: str | None = None,
    temperature: float | None = None,
) -> Transcription:
    """One file's transcript from ``ep`` (retried as a chat request is)."""
    check_transcribe_endpoint(ep)
    fields: dict = {
        "model": ep.model,
        "response_format": "verbose_json",
        "timestamp_granularities[]": ["segment", "word"] if words else ["segment"],
    }
    if language and not translate:  # a translation's language is English; OpenAI's takes none
        fields["language"] = language
    if prompt:
        fields["prompt"] = prompt
    if temperature is not None:
        fields["temperature"] = f"{temperature:g}"
    out = Transcription()
    data = Path(path).read_bytes()  # read once: a retry sends the same bytes
    route = "/audio/translations" if translate else "/audio/transcriptions"
    ep.retried(out, lambda: _once(ep, route, Path(path).name, data, fields, out))
    out.digest = ep.digest(out.model or ep.model)
    return out


def _once(ep, route: str, name: str, data: bytes, fields: dict, out: Transcription) -> None:
    t0 = time.perf_counter()
    r = ep.post(route, data=fields, files={"file": (name, data, "application/octet-stream")})
    out.total_s = time.perf_counter() - t0
    try:
        msg = r.json()
        out.text = str(msg["text"])
        raw = msg.get("segments")
        if not isinstance(raw, list):
            raise KeyError("segments")
        segs = [Segment(_t(s["start"]), _t(s["end"]), str(s["text"])) for s in raw]
        said = [
            Word(_t(w["start"]), _t(w["end"]), str(w["word"]), _prob(w.get("probability")))
            for w in msg.get("words") or []
        ]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise TaskError(f"endpoint {ep.name}: not a transcription answer: {r.text[:120]!r}") from None
    out.segments = with_words(segs, said) if "word" in fields["timestamp_granularities[]"] else segs
    out.language = str(msg.get("language") or "")
    duration = msg.get("duration")
    out.duration_s = float(duration) if isinstance(duration, (int, float)) else None
    out.model = str(msg.get("model") or "")
    if isinstance(msg.get("usage"), dict):
        out.server["usage"] = msg["usage"]


def _t(v) -> float:
    return round(float(v), 3)  # as a local transcript's times


def _prob(v) -> float | None:
    return None if v is None else round(float(v), 4)


def with_words(segments: list[Segment], words: list[Word]) -> list[Segment]:
    """OpenAI's verbose_json lists the words apart from the segments: give each segment the run
    of words that spells its text (spaces aside); where they do not spell the segments, each word
    goes to the segment its middle falls in (or the nearest)."""
    groups = _spelled(segments, words) or _by_time(segments, words)
    return [Segment(s.start, s.end, s.text, tuple(g)) for s, g in zip(segments, groups, strict=True)]


def _spelled(segments: list[Segment], words: list[Word]) -> list[list[Word]] | None:
    out, j = [], 0
    for s in segments:
        target, got, first = "".join(s.text.split()), "", j
        while j < len(words) and len(got) < len(target):
            got += "".join(words[j].word.split())
            j += 1
        if got != target:
            return None
        out.append(words[first:j])
    return out if j == len(words) else None


def _by_time(segments: list[Segment], words: list[Word]) -> list[list[Word]]:
    groups: list[list[Word]] = [[] for _ in segments]
    if not segments:
        return groups
    starts = [s.start for s in segments]
    for w in words:
        mid = (w.start + w.end) / 2
        k = max(0, bisect.bisect_right(starts, mid) - 1)
        if mid > segments[k].end and k + 1 < len(segments):
            if segments[k + 1].start - mid < mid - segments[k].end:
                k += 1
        groups[k].append(w)
    return groups
