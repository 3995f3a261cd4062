"""Rebuild samples/meeting.wav, meeting.txt and meeting.tsv from Debian's pocketsphinx-testdata.

    apt-get install -y pocketsphinx-testdata && python samples/build_meeting.py

The recording is real speech: five consecutive LibriVox sentences of *Sense and Sensibility*
(public domain), then CMU's "go forward" and playing-card utterances (BSD-2), separated by
pauses of a meeting's length so that voice-activity detection and 30 s chunk seams are exercised.
meeting.tsv gives each utterance's start and end (seconds) and its published reference text.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

DATA = Path("/usr/share/pocketsphinx/test/data")
HERE = Path(__file__).resolve().parent
SR = 16000

# (file, pause before it in seconds). The pauses vary like a conversation's.
PLAN = [
    ("librivox/sense_and_sensibility_01_austen_64kb-0870.wav", 0.8),
    ("librivox/sense_and_sensibility_01_austen_64kb-0880.wav", 1.6),
    ("librivox/sense_and_sensibility_01_austen_64kb-0890.wav", 2.4),
    ("librivox/sense_and_sensibility_01_austen_64kb-0920.wav", 1.2),
    ("librivox/sense_and_sensibility_01_austen_64kb-0930.wav", 2.0),
    ("goforward.raw", 3.0),
    ("cards/001.wav", 2.2),
    ("cards/002.wav", 1.8),
    ("cards/003.wav", 2.5),
    ("cards/004.wav", 1.9),
    ("cards/005.wav", 2.1),
]
TAIL_S = 2.5
GOFORWARD = "go forward ten meters"


def references() -> dict[str, str]:
    refs = {}
    for name in ("librivox/transcription", "cards/cards.transcription"):
        for line in (DATA / name).read_text().splitlines():
            m = re.match(r"<s>(.*)</s>\s*\((.+)\)", line.strip())
            if m:
                refs[m.group(2)] = " ".join(m.group(1).split())
    refs["goforward"] = GOFORWARD
    return refs


def load(rel: str) -> np.ndarray:
    path = DATA / rel
    if path.suffix == ".raw":  # headerless 16 kHz signed 16-bit mono
        return np.fromfile(path, dtype="<i2")
    audio, sr = sf.read(path, dtype="int16")
    assert sr == SR and audio.ndim == 1, (rel, sr, audio.shape)
    return audio


def main() -> None:
    if not DATA.exists():
        sys.exit("install Debian's pocketsphinx-testdata first: apt-get install -y pocketsphinx-testdata")
    refs = references()
    parts, rows, t = [], [], 0
    for rel, pause in PLAN:
        parts.append(np.zeros(int(pause * SR), np.int16))
        t += int(pause * SR)
        clip = load(rel)
        key = Path(rel).stem
        rows.append(f"{t / SR:.3f}\t{(t + len(clip)) / SR:.3f}\t{rel}\t{refs[key]}")
        parts.append(clip)
        t += len(clip)
    parts.append(np.zeros(int(TAIL_S * SR), np.int16))
    audio = np.concatenate(parts)
    sf.write(HERE / "meeting.wav", audio, SR, subtype="PCM_16")
    (HERE / "meeting.tsv").write_text("start_s\tend_s\tsource\ttext\n" + "\n".join(rows) + "\n")
    (HERE / "meeting.txt").write_text("\n".join(r.split("\t")[3] for r in rows) + "\n")
    print(f"meeting.wav: {len(audio) / SR:.1f} s, {len(rows)} utterances")


if __name__ == "__main__":
    main()
