"""Audio in any container: m4a, mp4, aac, opus, webm, mkv, mp3 and the sound track of a video,
decoded through PyAV when libsndfile cannot read them, sniffed by content, streamed in bounded
memory. The files are made here by re-encoding with PyAV: no binary fixtures."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from taskrun.pipelines.speech import audio
from taskrun.runner.cli import main
from taskrun.tasks.inputs import sniff, sniff_bytes
from tests.tiny.whisper import SAMPLES, build_ct2, clip
from tools.wer import wer

SR = 16000
# name → (container format, audio codec, codec rate, video codec)
FORMATS = {
    "m4a": ("ipod", "aac", None, None),
    "aac": ("adts", "aac", None, None),
    "opus": ("opus", "libopus", 48000, None),
    "webm": ("webm", "libopus", 48000, None),
    "mp3": ("mp3", "libmp3lame", None, None),
    "mp4": ("mp4", "aac", None, "mpeg4"),  # a video with a sound track
    "mkv": ("matroska", "flac", None, "mpeg4"),
}


def encode(
    x: np.ndarray,
    sr: int,
    path: Path,
    fmt: str,
    codec: str | None,
    rate: int | None = None,
    video: str | None = None,
    options: dict | None = None,
) -> Path:
    """Mono float samples → a file in ``fmt`` with PyAV (FFmpeg's encoders in its wheel)."""
    import av

    with av.open(str(path), "w", format=fmt, options=options or {}) as out:
        v = out.add_stream(video, rate=5) if video else None
        if v is not None:
            v.width, v.height, v.pix_fmt = 64, 48, "yuv420p"
        a = out.add_stream(codec, rate=rate or sr, layout="mono") if codec else None
        step = sr // 5
        for k, i in enumerate(range(0, len(x), step)):
            if a is not None:
                f = av.AudioFrame.from_ndarray(
                    (x[None, i : i + step] * 32767).astype(np.int16), format="s16", layout="mono"
                )
                f.sample_rate, f.pts, f.time_base = sr, i, Fraction(1, sr)
                for p in a.encode(f):
                    out.mux(p)
            if v is not None:
                for p in v.encode(av.VideoFrame.from_ndarray(np.full((48, 64, 3), k % 256, np.uint8), "rgb24")):
                    out.mux(p)
        for s in (a, v):
            for p in s.encode(None) if s is not None else ():
                out.mux(p)
    return path


def make(name: str, x: np.ndarray, d: Path, sr: int = SR) -> Path:
    fmt, codec, rate, video = FORMATS[name]
    return encode(x, sr, d / f"a.{name}", fmt, codec, rate, video)


def tone(seconds: float, hz: float = 440.0, sr: int = SR) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_container_is_sniffed_decoded_and_resampled(name, tmp_path):
    path = make(name, tone(3.0, 1000.0), tmp_path)
    assert path.stat().st_size < 200_000
    assert sniff(path) == "audio"
    y = audio.read_audio(path, SR)
    assert y.dtype == np.float32 and abs(len(y) / SR - 3.0) < 0.15  # codec priming and padding
    mid = y[SR // 2 : SR // 2 + SR]  # 1 s → 1 Hz bins
    assert abs(int(np.argmax(np.abs(np.fft.rfft(mid)))) - 1000) <= 1
    assert np.sqrt(np.mean(mid**2)) == pytest.approx(0.3 / np.sqrt(2), rel=0.1)


def test_pyav_blocks_stay_bounded_and_tile_the_stream(tmp_path):
    path = make("m4a", tone(25.0, 300.0, 44100), tmp_path, sr=44100)
    assert audio.probe(path).decoder == "av"
    sizes = [len(b) for b in audio.read_blocks(path, SR)]
    assert max(sizes) <= audio.BLOCK_S * SR + 64 and len(sizes) >= 3
    assert abs(sum(sizes) - 25 * SR) < 0.1 * SR


def test_sniffing_by_content_not_name():
    assert sniff_bytes(b"\x00\x00\x00\x20ftypM4A \x00\x00\x02\x00") == "audio"
    assert sniff_bytes(b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00") == "audio"  # video: its sound track
    assert sniff_bytes(b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00") == "binary"  # a still image
    assert sniff_bytes(b"\x1a\x45\xdf\xa3\x9fB\x86\x81\x01") == "audio"
    assert sniff_bytes(b"\xff\xf1\x50\x80\x02\x1f\xfc") == "audio"
    assert sniff_bytes(b"\xff\xf9\x50\x80\x02\x1f\xfc") == "audio"
    assert sniff_bytes(b"RIFF\x00\x00\x00\x00AVI LIST") == "audio"
    assert sniff_bytes(b"\x89PNG\r\n\x1a\n") == "image" and sniff_bytes(b"just text\n") == "text"


def test_a_video_without_sound_is_a_clear_error(tmp_path, tiny_dir):
    path = encode(tone(2.0), SR, tmp_path / "silent.mp4", "mp4", None, video="mpeg4")
    r = CliRunner().invoke(main, ["transcribe", str(path), "--model", str(build_ct2(tiny_dir)), "-q"])
    assert r.exit_code != 0
    assert "silent.mp4" in r.output and "has no audio track" in r.output and "Traceback" not in r.output


def test_a_damaged_m4a_says_it_cannot_be_decoded(tmp_path, tiny_dir):
    good = make("m4a", tone(2.0), tmp_path).read_bytes()
    bad = tmp_path / "bad.m4a"
    bad.write_bytes(good[:40] + bytes(len(good) - 40))  # the header survives, the boxes do not
    r = CliRunner().invoke(main, ["transcribe", str(bad), "--model", str(build_ct2(tiny_dir)), "-q"])
    assert r.exit_code != 0 and "bad.m4a" in r.output and "cannot be decoded" in r.output


def test_an_m4a_cut_off_mid_recording_is_transcribed_as_far_as_it_goes(tmp_path, tiny_dir):
    """Index first ('faststart', as many phones write it), then the file ends half-way: the
    first half is audio all the same. It is transcribed, the job says it is partial and exits
    non-zero unless --allow-partial accepts it."""
    whole = encode(tone(20.0), SR, tmp_path / "whole.m4a", "ipod", "aac", options={"movflags": "faststart"})
    data = whole.read_bytes()
    assert data.find(b"moov") < data.find(b"mdat")
    cut = tmp_path / "cut.m4a"
    cut.write_bytes(data[: len(data) // 2])
    model = str(build_ct2(tiny_dir))
    r = CliRunner().invoke(main, ["transcribe", str(cut), "--model", model, "--json", "-q"])
    assert r.exit_code == 1 and "cut short or damaged" in r.output and "--allow-partial" in r.output
    r = CliRunner().invoke(main, ["transcribe", str(cut), "--model", model, "--json", "-q", "--allow-partial"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)["items"][0]["result"]
    assert 8.0 < res["audio_s"] < 11.0  # the half that is there (a 10 s block used to be lost with it)


def test_an_m4a_whose_recording_was_never_finished_names_the_missing_index(tmp_path, tiny_dir):
    """The index written last (the default) and the file cut before it: no decoder can read it;
    the error says why and what can repair it, instead of 'format not recognised'."""
    data = encode(tone(20.0), SR, tmp_path / "whole.m4a", "ipod", "aac").read_bytes()
    assert data.find(b"mdat") < data.find(b"moov")
    cut = tmp_path / "interrupted.m4a"
    cut.write_bytes(data[: len(data) // 2])
    r = CliRunner().invoke(main, ["transcribe", str(cut), "--model", str(build_ct2(tiny_dir)), "-q"])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert "interrupted.m4a is an unfinished recording" in r.output and "'moov' box" in r.output
    assert "untrunc" in r.output


@pytest.mark.parametrize("name", ["m4a", "webm", "mp4"])
def test_tiny_model_transcribes_containers_on_the_file_timeline(name, tmp_path, tiny_dir):
    x, sr = sf.read(clip(tiny_dir), dtype="float32")
    path = make(name, x, tmp_path, sr)
    r = CliRunner().invoke(main, ["transcribe", str(path), "--model", str(build_ct2(tiny_dir)), "--json", "-q"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)["items"][0]["result"]
    assert res["audio_s"] == pytest.approx(3.4, abs=0.1)
    assert all(0 <= s["start"] <= s["end"] <= res["audio_s"] for s in res["segments"])


@pytest.mark.real
def test_real_transcripts_of_m4a_opus_webm_match_the_wav(tmp_path):
    """The first 15 s of samples/meeting.wav, re-encoded: tiny.en hears the same words in each."""
    x, sr = sf.read(SAMPLES / "meeting.wav", dtype="float32")
    wav = tmp_path / "a.wav"
    sf.write(wav, x[: 15 * sr], sr, subtype="PCM_16")
    files = [wav] + [make(n, x[: 15 * sr], tmp_path, sr) for n in ("m4a", "opus", "webm")]
    r = CliRunner().invoke(main, ["transcribe", *map(str, files), "--json", "-q"])
    assert r.exit_code == 0, r.output
    texts = [it["result"]["text"] for it in json.loads(r.stdout)["items"]]
    ref = " ".join(line for line in (SAMPLES / "meeting.txt").read_text().splitlines()[:2])
    base = wer(ref, texts[0])
    assert base <= 0.15, texts[0]
    for path, text in zip(files[1:], texts[1:]):
        assert abs(wer(ref, text) - base) <= 0.01, (path.name, text, texts[0])
