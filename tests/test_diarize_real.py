"""transcribe --speakers with the real GE2E encoder and tiny.en, on real voices with known turns:
samples/meeting.wav (three sources, samples/meeting.tsv) and a recording rebuilt here from its
utterances with the voices taking turns back and forth."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from taskrun.runner.cli import main
from tests.test_transcribe import SAMPLES, utterances
from tools.der import der, read_rttm

pytestmark = pytest.mark.real
SR = 16000


def voice(src: str) -> str:
    return src.split("/")[0].split(".")[0]  # librivox, goforward, cards: one reader each


def speakers(*args) -> dict:
    r = CliRunner().invoke(main, ["transcribe", *map(str, args), "--speakers", "--json", "-q"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


def turns_of(out: dict) -> list[tuple[float, float, str]]:
    return [(s["start"], s["end"], s["speaker"]) for s in out["items"][0]["result"]["segments"]]


def test_meeting_der_and_speaker_count(tmp_path):
    ref = [(a, b, voice(src)) for a, b, src, _ in utterances()]
    out = speakers(SAMPLES / "meeting.wav")
    assert out["metrics"]["speakers"] == 3
    assert out["metrics"]["speaker_model"].startswith("resemblyzer-ge2e@sha256:")
    r = CliRunner().invoke(
        main, ["transcribe", str(SAMPLES / "meeting.wav"), "--speakers", "-o", str(tmp_path / "m.rttm")]
    )
    assert r.exit_code == 0, r.output
    hyp = read_rttm((tmp_path / "m.rttm").read_text())
    assert der(turns_of(out), hyp) == 0.0  # the RTTM says what the json says (gaps < 0.5 s joined)
    assert der(ref, hyp) <= 0.15, hyp
    assert all(w["speaker"] == s["speaker"] for s in out["items"][0]["result"]["segments"] for w in s["words"])


@pytest.fixture(scope="module")
def turns_wav(tmp_path_factory):
    """Voices taking turns: librivox, cards, librivox, goforward, cards, librivox, cards, 1 s apart."""
    x, sr = sf.read(SAMPLES / "meeting.wav", dtype="float32")
    u = utterances()
    lib, cards, go = (
        [k for k in u if "librivox" in k[2]],
        [k for k in u if "cards" in k[2]],
        [k for k in u if "goforward" in k[2]],
    )
    order = [lib[0], cards[0], lib[1], go[0], cards[4], lib[3], cards[2]]
    parts, ref, t = [np.zeros(SR, np.float32)], [], 1.0
    for a, b, src, _ in order:
        clip = x[int(a * sr) : int(b * sr)]
        ref.append((t, t + len(clip) / sr, voice(src)))
        parts += [clip, np.zeros(SR, np.float32)]
        t += len(clip) / sr + 1.0
    p = tmp_path_factory.mktemp("turns") / "turns.wav"
    sf.write(p, np.concatenate(parts), SR, subtype="PCM_16")
    return p, ref


def test_turns_der_count_and_stable_labels(turns_wav):
    path, ref = turns_wav
    out = speakers(path)
    assert out["metrics"]["speakers"] == 3
    assert der(ref, turns_of(out)) <= 0.15, turns_of(out)
    again = speakers(path)
    assert turns_of(again) == turns_of(out)  # same labels, same names, on a rerun


def test_one_voice_is_one_speaker(tmp_path):
    x, sr = sf.read(SAMPLES / "meeting.wav", dtype="float32")
    p = tmp_path / "one.wav"
    sf.write(p, x[: int(33 * sr)], sr, subtype="PCM_16")  # the five LibriVox sentences
    assert speakers(p)["metrics"]["speakers"] == 1


def test_silence_has_no_speakers(tmp_path):
    p = tmp_path / "quiet.wav"
    sf.write(p, np.zeros(5 * SR, np.float32), SR, subtype="PCM_16")
    out = speakers(p)
    assert out["metrics"]["speakers"] == 0 and out["items"][0]["result"]["segments"] == []
    r = CliRunner().invoke(main, ["transcribe", str(p), "--speakers", "-q"])
    assert r.exit_code == 0 and "no speech found" in r.output


def test_batch_folder_with_speakers(tmp_path):
    """`run batch transcribe FOLDER --speakers`: speakers in each line, an SRT and an RTTM per file."""
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "in" / "meeting.wav").write_bytes((SAMPLES / "meeting.wav").read_bytes())
    args = ["batch", "transcribe", str(tmp_path / "in"), "-o", str(tmp_path / "t.jsonl")]
    r = CliRunner().invoke(main, [*args, "--out-dir", str(tmp_path / "out"), "--speakers", "-q", "--workers", "1"])
    assert r.exit_code == 0, r.output
    line = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    segs = line["result"]["segments"]
    assert {s["speaker"] for s in segs} == {"SPEAKER_1", "SPEAKER_2", "SPEAKER_3"}
    hyp = read_rttm((tmp_path / "out" / "meeting.wav.rttm").read_text())
    assert der([(s["start"], s["end"], s["speaker"]) for s in segs], hyp) == 0.0
    assert "SPEAKER_1: " in (tmp_path / "out" / "meeting.wav.srt").read_text()
