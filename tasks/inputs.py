"""Reading job inputs and sniffing their kind from content, not from the file name."""

from __future__ import annotations

from pathlib import Path

from taskrun.tasks.base import Input, TaskError

# Leading bytes → kind. Enough to route a file to the right task before any decoder runs.
_MAGIC: list[tuple[bytes, int, str]] = [
    (b"\x89PNG\r\n\x1a\n", 0, "image"),
    (b"\xff\xd8\xff", 0, "image"),
    (b"GIF87a", 0, "image"),
    (b"GIF89a", 0, "image"),
    (b"BM", 0, "image"),
    (b"II*\x00", 0, "image"),
    (b"MM\x00*", 0, "image"),
    (b"fLaC", 0, "audio"),
    (b"OggS", 0, "audio"),
    (b"ID3", 0, "audio"),
    (b"\xff\xfb", 0, "audio"),  # MPEG-1 layer III (mp3) without an ID3 tag
    (b"\xff\xfa", 0, "audio"),
    (b"\xff\xf3", 0, "audio"),  # MPEG-2 layer III
    (b"\xff\xf2", 0, "audio"),
    (b"\xff\xf1", 0, "audio"),  # AAC in ADTS frames (.aac), MPEG-4 and MPEG-2
    (b"\xff\xf9", 0, "audio"),
    (b"FORM", 0, "audio"),  # AIFF
    (b".snd", 0, "audio"),
    (b"\x1a\x45\xdf\xa3", 0, "audio"),  # EBML: WebM and Matroska (browser recordings, mkv video)
    (b"#!AMR", 0, "audio"),  # phone voice notes
    (b"0&\xb2u\x8ef\xcf\x11", 0, "audio"),  # ASF: wma, wmv
    (b"caff", 0, "audio"),  # Apple Core Audio
]

# ISO base media ("....ftyp<brand>"): mp4, m4a, mov, 3gp are media with (usually) a sound track and
# count as audio: transcribe reads their audio stream. These brands are still images, not media.
_IMAGE_BRANDS = {b"heic", b"heix", b"hevc", b"heim", b"heis", b"mif1", b"msf1", b"avif", b"avis"}

SNIFF_BYTES = 8192


def sniff_bytes(head: bytes) -> str:
    """Kind of a file from its first bytes: image, audio, text or binary."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "audio"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":  # a video: its sound track is audio
        return "audio"
    if head[4:8] == b"ftyp":
        return "binary" if head[8:12] in _IMAGE_BRANDS else "audio"
    for magic, offset, kind in _MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return kind
    if b"\x00" in head:
        return "binary"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the sniff boundary is still text. Text in another
        # encoding (latin-1, cp1252) is still text: reading it says how to convert it.
        if exc.start < len(head) - 4 and _control_ratio(head) > 0.05:
            return "binary"
    return "text"


def _control_ratio(head: bytes) -> float:
    """Share of bytes that no text encoding uses for ordinary characters."""
    if not head:
        return 0.0
    ctrl = sum(1 for b in head if (b < 32 and b not in (9, 10, 12, 13)) or b == 127)
    return ctrl / len(head)


def sniff(path: str | Path) -> str:
    with open(path, "rb") as f:
        return sniff_bytes(f.read(SNIFF_BYTES))


def read_text_file(path: str | Path) -> str:
    """A whole UTF-8 text file, or a TaskError that says what is wrong with it."""
    p = Path(path)
    kind = sniff(p)
    if kind != "text":
        raise TaskError(f"{p} is {'an' if kind[0] in 'ai' else 'a'} {kind} file, not text")
    try:
        return p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TaskError(
            f"{p} is not UTF-8 text (byte {exc.start}); convert it, e.g. "
            f"`iconv -f latin1 -t utf-8 {p} > {p.stem}.utf8{p.suffix}`"
        ) from None


def file_input(path: str | Path) -> Input:
    """An Input for a file the user named; text files keep their text."""
    p = Path(path)
    if not p.exists():
        raise TaskError(f"{p}: no such file")
    if p.is_dir():
        raise TaskError(f"{p} is a folder; name the files in it, or use a task option that takes a folder")
    if p.stat().st_size == 0:
        raise TaskError(f"{p} is empty (0 bytes)")
    kind = sniff(p)
    if kind == "text":
        return Input(source=str(p), kind="text", text=read_text_file(p), path=str(p))
    return Input(source=str(p), kind=kind, path=str(p))


def text_input(text: str, source: str) -> Input:
    if not text.strip():
        raise TaskError(f"{source} is empty; give some text")
    return Input(source=source, kind="text", text=text)


def lines_of(path: str | Path) -> list[Input]:
    """One text Input per non-blank line of a text file."""
    text = read_text_file(path)
    out = [
        Input(source=f"{path}:{i}", kind="text", text=line.strip())
        for i, line in enumerate(text.splitlines(), 1)
        if line.strip()
    ]
    if not out:
        raise TaskError(f"{path} has no non-blank lines")
    return out


def expand_folder(path: str | Path, kinds: tuple[str, ...]) -> list[Path]:
    """Files in a folder (sorted, recursive) whose sniffed kind is one of ``kinds``."""
    files = [f for f in sorted(Path(path).rglob("*")) if f.is_file() and not f.name.startswith(".")]
    keep = [f for f in files if f.stat().st_size and sniff(f) in kinds]
    if not keep:
        raise TaskError(f"{path} holds no {' or '.join(kinds)} files")
    return keep


def is_path(arg: str) -> bool:
    """An argument names a file when one exists by that name; a long sentence is not a name."""
    if not arg or "\n" in arg or len(arg) > 4096:
        return False
    try:
        return Path(arg).exists()
    except OSError:  # ENAMETOOLONG and friends: it is text
        return False
