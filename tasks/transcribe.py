"""transcribe: recordings → transcripts with segment timestamps (txt, json, srt, vtt)."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from taskrun.tasks.base import Input, Task, TaskError, check_input_kind, metric, option, require, to_jsonable
from taskrun.tasks.subtitles import cues_of

WHISPER_WINDOW_S = 30.0  # Whisper hears 30 s at a time; a longer chunk would be cut off


@dataclass(frozen=True)
class Options:
    language: str | None = option(
        None,
        "--language",
        metavar="CODE",
        help="Spoken language as a code (en, de, fr, ...); default: English "
        "for .en models, detected from the first speech otherwise.",
    )
    task: str = option(
        "transcribe",
        "--task",
        choices=("transcribe", "translate"),
        help="transcribe keeps the spoken language; translate outputs English (multilingual Whisper only).",
    )
    chunk_s: float = option(
        30.0,
        "--chunk-s",
        help="Longest piece Whisper hears at once, in seconds. On ctranslate2 each "
        "piece starts at the last timestamp decoded (faster-whisper's seek); "
        "elsewhere each cut falls in the quietest moment of its last seconds.",
    )
    vad: bool = option(
        True,
        "--vad",
        help="Skip non-speech with voice-activity detection (Silero): faster on "
        "meetings, and silence yields no invented words.",
    )
    beam_size: int | None = option(
        None,
        "--beam-size",
        help="Beam width for Whisper (1 = greedy, the default: beam 5 gave the same "
        "WER on the project's English speech, and is slower; see the README's Performance section).",
    )
    batch_size: int = option(
        1,
        "--batch-size",
        help="Windows of a long file decoded as one batch after its first (ctranslate2 "
        "and transformers; faster on long audio on a GPU or many cores, but windows "
        "in a batch get no previous-text prompt).",
    )
    word_timestamps: bool = option(
        False,
        "--word-timestamps",
        help="Also give each word's start and end; srt/vtt cues are then "
        "cut at the words' own times (estimated from the segment's "
        "without it).",
    )
    allow_partial: bool = option(
        False,
        "--allow-partial",
        help="Accept a recording cut short or damaged (it holds less than its "
        "header declares): its readable part is transcribed either way, "
        "with a warning and the job logged as partial; without this the "
        "command then exits non-zero.",
    )
    max_line_width: int = option(
        42,
        "--max-line-width",
        help="srt/vtt: longest subtitle line, in characters (42: the broadcast "
        "convention); 0 keeps one cue per decoded segment, unwrapped.",
    )
    speakers: bool = option(
        False,
        "--speakers",
        help="Say who spoke: each segment and word labelled SPEAKER_1, SPEAKER_2, ... "
        "(GE2E voice embeddings clustered; turns on --word-timestamps). -o x.rttm writes RTTM.",
    )
    num_speakers: int | None = option(
        None, "--num-speakers", metavar="N", help="With --speakers: exactly N voices (default: estimated)."
    )
    min_speakers: int = option(1, "--min-speakers", help="With --speakers: at least this many voices.")
    max_speakers: int | None = option(None, "--max-speakers", metavar="N", help="With --speakers: at most N voices.")
    max_line_count: int = option(2, "--max-line-count", help="srt/vtt: lines per cue.")
    max_cue_s: float = option(6.0, "--max-cue-s", help="srt/vtt: longest time one cue stays on screen, seconds.")
    highlight_words: bool = option(
        False,
        "--highlight-words",
        help="srt/vtt karaoke style: each cue is repeated per word with the "
        "word being spoken underlined (turns on --word-timestamps).",
    )

    def __post_init__(self):
        if self.language is not None:
            require(
                bool(re.fullmatch(r"[a-z]{2,3}", self.language)),
                f"--language takes a language code such as en or de (got '{self.language}')",
            )
        require(self.task in ("transcribe", "translate"), f"--task must be transcribe or translate (got '{self.task}')")
        require(
            1.0 <= self.chunk_s <= WHISPER_WINDOW_S,
            f"--chunk-s must be between 1 and {WHISPER_WINDOW_S:g} seconds, the length Whisper "
            f"hears at once (got {self.chunk_s:g}); long files are chunked automatically",
        )
        require(
            self.beam_size is None or 1 <= self.beam_size <= 16, f"--beam-size must be 1 to 16 (got {self.beam_size})"
        )
        require(1 <= self.batch_size <= 64, f"--batch-size must be 1 to 64 windows (got {self.batch_size})")
        require(
            self.max_line_width == 0 or self.max_line_width >= 10,
            f"--max-line-width must be at least 10 characters, or 0 for unwrapped cues (got {self.max_line_width})",
        )
        require(self.max_line_count >= 1, f"--max-line-count must be at least 1 (got {self.max_line_count})")
        require(self.max_cue_s >= 1.0, f"--max-cue-s must be at least 1 second (got {self.max_cue_s:g})")
        self._check_speakers()
        if self.highlight_words:  # underlining a word needs its time
            object.__setattr__(self, "word_timestamps", True)

    def _check_speakers(self) -> None:
        n, lo, hi = self.num_speakers, self.min_speakers, self.max_speakers
        require(n is None or n >= 1, f"--num-speakers must be at least 1 (got {n})")
        require(lo >= 1, f"--min-speakers must be at least 1 (got {lo})")
        require(hi is None or hi >= lo, f"--max-speakers ({hi}) must be at least --min-speakers ({lo})")
        require(
            self.speakers or (n is None and lo == 1 and hi is None),
            "--num-speakers, --min-speakers and --max-speakers need --speakers",
        )
        if self.speakers:  # change points are refined to words: they need their times
            object.__setattr__(self, "word_timestamps", True)


@dataclass(frozen=True)
class Word:
    start: float  # seconds from the start of the file
    end: float
    word: str
    probability: float | None  # the model's confidence in the word; None where the runtime gives none
    speaker: str | None = None  # SPEAKER_k with --speakers


@dataclass(frozen=True)
class Segment:
    start: float  # seconds from the start of the file
    end: float
    text: str
    words: tuple[Word, ...] | None = None  # with --word-timestamps
    speaker: str | None = None  # SPEAKER_k with --speakers


@dataclass
class Transcript:
    source: str
    text: str
    language: str
    audio_s: float  # the decoded audio's length
    segments: list[Segment] = field(default_factory=list)

    def summary(self) -> str:
        head = self.text[:60] + ("…" if len(self.text) > 60 else "")
        return f"{self.audio_s:.1f} s, {len(self.segments)} segments: {head!r}"


Result = Transcript


@dataclass
class Metrics:
    audio_s: float = metric("length of all decoded audio, seconds")
    rtf: float = metric("processing time (read + resample + VAD + decode) ÷ audio_s; lower is faster")
    chunks: int = metric(
        "pieces handed to the model, silent ones skipped (on ctranslate2 a piece is up to "
        "5 min of speech, which faster-whisper walks in 30 s windows)",
        0,
    )
    words: int = metric("words in all transcripts", 0)
    speech_s: float | None = metric("audio that voice-activity detection kept as speech (with --vad)", None)
    rtf_speech: float | None = metric("processing time ÷ speech_s (with --vad)", None)
    speakers: int | None = metric("voices found in all files (with --speakers)", None)
    diarize_s: float | None = metric("speaker embedding + clustering time, inside rtf (with --speakers)", None)
    speaker_model: str | None = metric("the speaker model's digest (with --speakers)", None)


# --------------------------------------------------------------------------- formats


def clock(t: float, sep: str = ",", hours: bool = True) -> str:
    """Seconds → 00:01:02,345 (SRT) or 00:01:02.345 (VTT); rounded to the millisecond."""
    ms = max(0, int(round(t * 1000)))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}" if hours or h else f"{m:02d}:{s:02d}{sep}{ms:03d}"


def _timeline(items: list[Transcript]) -> list[Segment]:
    """All segments on one timeline: several files play one after another."""
    out, offset = [], 0.0
    for tr in items:
        out += [dataclasses.replace(s, start=s.start + offset, end=s.end + offset) for s in tr.segments if s.text]
        offset += tr.audio_s
    return out


def _cues(items: list[Transcript], options: Options | None) -> list[tuple[float, float, str]]:
    """(start, end, text) per cue: shaped to the line and time limits (tasks/subtitles.py), or one
    per decoded segment with --max-line-width 0."""
    o = options or Options()
    if any(s.speaker for tr in items for s in tr.segments):
        return _speaker_cues(items, o)
    if o.max_line_width == 0:
        return [(s.start, s.end, " ".join(s.text.replace("-->", "->").split())) for s in _timeline(items)]
    return cues_of(items, o.max_line_width, o.max_line_count, o.max_cue_s, o.highlight_words)


def _speaker_cues(items: list[Transcript], o: Options) -> list[tuple[float, float, str]]:
    """Cues that never mix voices: each stretch of one speaker shaped on its own, its speaker
    kept as the cue text's ``SPEAKER_k\t`` head (srt and vtt write it their own way)."""
    out: list[tuple[float, float, str]] = []
    segs = _timeline(items)
    k = 0
    while k < len(segs):
        j = k
        while j + 1 < len(segs) and segs[j + 1].speaker == segs[k].speaker:
            j += 1
        stretch = [Transcript("", "", "", 0.0, segs[k : j + 1])]
        o1 = dataclasses.replace(o, max_line_width=o.max_line_width or 42)
        who = segs[k].speaker or ""
        out += [
            (a, b, f"{who}\t{t}")
            for a, b, t in cues_of(stretch, o1.max_line_width, o1.max_line_count, o1.max_cue_s, o1.highlight_words)
        ]
        k = j + 1
    return out


def _who(text: str, vtt: bool) -> str:
    """A speaker cue's text: ``<v SPEAKER_1>…`` in WebVTT (its voice span), a ``SPEAKER_1: `` prefix in SRT."""
    if "\t" not in text:
        return text
    who, body = text.split("\t", 1)
    return f"<v {who}>{body}" if vtt else f"{who}: {body}"


def to_srt(items: list[Transcript], options: Options | None = None) -> str:
    blocks = [
        f"{i}\n{clock(a)} --> {clock(b)}\n{_who(text, False)}\n"
        for i, (a, b, text) in enumerate(_cues(items, options), 1)
    ]
    return "\n".join(blocks)


def to_vtt(items: list[Transcript], options: Options | None = None) -> str:
    blocks = [f"{clock(a, '.')} --> {clock(b, '.')}\n{_who(text, True)}\n" for a, b, text in _cues(items, options)]
    return "WEBVTT\n\n" + "\n".join(blocks)


def timed_line(seg: Segment) -> str:
    """``[00:01.2 → 00:05.0] SPEAKER_1: text`` (the speaker only when it is known)."""
    who = f"{seg.speaker}: " if seg.speaker else ""
    return f"[{clock(seg.start, '.', False)[:-2]} → {clock(seg.end, '.', False)[:-2]}] {who}{seg.text}"


def to_txt(items: list[Transcript]) -> str:
    if any(s.speaker for tr in items for s in tr.segments):  # who said what needs the times
        return (
            "\n".join(
                (f"# {tr.source}\n" if len(items) > 1 else "") + "\n".join(timed_line(s) for s in tr.segments)
                for tr in items
            )
            + "\n"
        )
    if len(items) == 1:
        return items[0].text + "\n"
    return "\n".join(f"# {tr.source}\n{tr.text}\n" for tr in items)


class TranscribeTask(Task):
    def check_input(self, inp: Input) -> None:
        """Before any model loads: the file must be audio whose header can be read and that holds
        samples (a header probe, milliseconds; tasks/audio_files.py)."""
        check_input_kind(self, inp)
        from taskrun.tasks.audio_files import probe_input

        probe_input(inp)

    def options_for_format(self, options: Options, fmt: str | None) -> Options:
        """The options a job needs to be written in ``fmt``: subtitles are cut at word boundaries,
        so srt/vtt ask the runtime for word timestamps (the runner calls this before the run)."""
        if fmt in ("srt", "vtt") and options.max_line_width and not options.word_timestamps:
            return dataclasses.replace(options, word_timestamps=True)
        return options

    def render_partial(self, seg: Segment, options) -> str:
        if seg.speaker:
            return timed_line(seg)
        return f"[{clock(seg.start, '.', False)} → {clock(seg.end, '.', False)}] {seg.text}"

    def render_tail(self, result: Transcript, options) -> str:
        return "(no speech found)" if not result.segments else ""

    def render(self, result: Transcript, options) -> str:
        if not result.segments:
            return f"{result.source}: (no speech found)"
        return "\n".join(self.render_partial(s, options) for s in result.segments)

    def write(self, items: list[Transcript], fmt: str, path: Path | None, options) -> str:
        if fmt == "srt":
            return to_srt(items, options)
        if fmt == "vtt":
            return to_vtt(items, options)
        if fmt == "txt":
            return to_txt(items)
        if fmt == "rttm":
            from taskrun.tasks.speakers import to_rttm

            return "".join(to_rttm(tr.source, tr.segments) for tr in items)
        if fmt == "json":
            return json.dumps(to_jsonable(items), ensure_ascii=False, indent=1)
        raise TaskError(f"transcribe has no '{fmt}' format; choose one of {', '.join(self.formats)}")

    def handoff(self, result: Transcript) -> str:
        if any(s.speaker for s in result.segments):  # a summary can then say who decided what
            return "\n".join(f"{s.speaker}: {s.text}" for s in result.segments)
        return result.text


TASK = TranscribeTask(
    name="transcribe",
    summary="Turn speech recordings into text with timestamps (long files are chunked).",
    takes="audio files (wav, flac, ogg, mp3, m4a/mp4/aac, opus, webm; video files' sound track; any "
    "sample rate and channel count) or folders of them",
    returns="a transcript per file with timed segments; --format txt|json|srt|vtt (subtitles shaped to "
    "--max-line-width, --max-line-count, --max-cue-s), -o FILE",
    Options=Options,
    Result=Result,
    Metrics=Metrics,
    input_kinds=("audio",),
    model_kinds="a speech-recognition model such as whisper-tiny.en",
    formats=("text", "json", "txt", "srt", "vtt", "rttm"),
    produces="text",
)
