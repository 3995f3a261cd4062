"""Language-aware model choice for transcribe: with no --model and an English-only default, speech
that is not English (or a --language that is not en) runs on the multilingual default, said on
stderr in one line and kept in the job's JSON and run-log row; a model the user named stays, with a
warning naming the multilingual alias; --language en skips the check.

The decision is tested fast on tiny models with the detector replaced (a random model's language
guess means nothing); the real detector on the German and English samples is marked real."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from taskrun.pipelines.speech import language
from taskrun.runner.cli import main
from taskrun.runner.runlog.store import RunLog
from tests.tiny import models_toml_with
from tests.tiny.whisper import SAMPLES, build_ct2, clip


def invoke(*args):
    return CliRunner().invoke(main, ["transcribe", *map(str, args)])


@pytest.fixture
def tiny_pair(tiny_dir, tmp_path, monkeypatch):
    """Two tiny CTranslate2 Whispers as aliases: "tiny-en" (the default, treated as English-only)
    and "tiny-multi" (the multilingual default); the detector hears German."""
    multi = tiny_dir / "tiny-whisper-ct2-multi"
    if not multi.exists():
        shutil.copytree(build_ct2(tiny_dir), multi)
    aliases = {"tiny-en": {"local": str(build_ct2(tiny_dir))}, "tiny-multi": {"local": str(multi)}}
    toml = models_toml_with(aliases, tmp_path)
    text = toml.read_text().replace('"transcribe" = "whisper-tiny.en"', '"transcribe" = "tiny-en"')
    toml.write_text(
        text.replace('"transcribe:multilingual" = "whisper-base"', '"transcribe:multilingual" = "tiny-multi"')
    )
    monkeypatch.setenv("TASKRUN_MODELS_TOML", str(toml))
    monkeypatch.setattr(language, "english_only", lambda card: card.name == "tiny-en")
    heard = []

    def fake_detect(inputs, alias, device, offline, meanwhile=None):
        heard.append(alias)
        return inputs[0].path, "de", 0.97

    monkeypatch.setattr(language, "detect", fake_detect)
    return heard


def job(*args):
    r = invoke(*args, "--json", "--beam-size", "1")
    assert r.exit_code == 0, r.output
    return r, json.loads(r.stdout)


def test_default_switches_to_the_multilingual_model_and_says_so(tiny_pair, tiny_dir):
    r, out = job(clip(tiny_dir))
    assert out["model"]["name"] == "tiny-multi" and tiny_pair == ["tiny-multi"]
    assert len(out["notes"]) == 1 and "German (de, p=0.97)" in out["notes"][0]
    assert "runs on tiny-multi" in out["notes"][0]
    assert r.stderr.count("note:") == 1 and "English-only" in r.stderr  # one line on stderr
    row = RunLog().recent(1)[0]
    # the job's notes, then what ran (here how CTranslate2's threads waited)
    assert row["model"] == "tiny-multi" and row["notes"][: len(out["notes"])] == out["notes"]
    assert all(n.startswith("CTranslate2's threads ") for n in row["notes"][len(out["notes"]) :])
    assert row["model_digest"] == out["model"]["digest"]


def test_a_named_english_only_model_stays_with_a_warning(tiny_pair, tiny_dir):
    r, out = job(clip(tiny_dir), "--model", "tiny-en")
    assert out["model"]["name"] == "tiny-en"
    assert "use --model tiny-multi" in out["notes"][0] and "note:" in r.stderr


def test_language_en_skips_detection_and_another_language_switches_without_it(tiny_pair, tiny_dir):
    _, out = job(clip(tiny_dir), "--language", "en")
    assert out["model"]["name"] == "tiny-en" and out["notes"] == [] and tiny_pair == []
    r = invoke(clip(tiny_dir), "--language", "de", "--json", "--beam-size", "1")
    # The tiny "multilingual" copy is not multilingual: its own check refuses de, naming the fix.
    assert tiny_pair == [] and "note: --language de" in r.stderr and "tiny-multi" in r.stderr


def test_english_only_is_read_from_the_vocabulary(tmp_path):
    from taskrun.tasks.base import ModelCard

    def card(arch, path):
        return ModelCard("m", str(path), arch, ("transcribe",), "ctranslate2", ("ctranslate2",), 0, "sha256:0", "x")

    (tmp_path / "vocabulary.txt").write_text("t\n" * language.ENGLISH_ONLY_VOCAB)
    assert language.english_only(card("WhisperCT2", tmp_path))
    (tmp_path / "vocabulary.txt").write_text("t\n" * (language.ENGLISH_ONLY_VOCAB + 1))
    assert not language.english_only(card("WhisperCT2", tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 51864}))
    assert language.english_only(card("WhisperForConditionalGeneration", tmp_path))
    assert not language.english_only(card("Wav2Vec2ForCTC", tmp_path))


def test_first_speech_is_found_by_vad(tmp_path):
    x = language.first_speech(str(SAMPLES / "meeting.wav"))
    assert x is not None and len(x) == language.DETECT_S * 16000  # the first utterance is longer
    sf.write(tmp_path / "quiet.wav", (0.001 * np.ones(16000 * 5)).astype(np.float32), 16000)
    assert language.first_speech(str(tmp_path / "quiet.wav")) is None  # nothing to detect from


@pytest.mark.real
def test_real_german_routes_to_whisper_base_and_an_explicit_tiny_en_warns():
    r, out = job(SAMPLES / "guten-morgen.wav")
    res = out["items"][0]["result"]
    assert out["model"]["name"] == "whisper-base" and res["language"] == "de"
    assert "guten morgen" in res["text"].lower() and "German (de" in out["notes"][0]
    assert RunLog().recent(1)[0]["model"] == "whisper-base"
    r, out = job(SAMPLES / "guten-morgen.wav", "--model", "whisper-tiny.en")
    assert out["model"]["name"] == "whisper-tiny.en" and "use --model whisper-base" in out["notes"][0]


@pytest.mark.real
def test_real_english_keeps_the_default_without_notes(tmp_path):
    x, sr = sf.read(SAMPLES / "meeting.wav", dtype="int16")
    path = tmp_path / "en.wav"
    sf.write(path, x[: 13 * sr], sr, subtype="PCM_16")
    _, out = job(path)
    assert out["model"]["name"] == "whisper-tiny.en" and out["notes"] == []
    assert "dashwood" in out["items"][0]["result"]["text"].lower()


def test_the_detector_runs_on_one_thread_in_a_cache_slot_of_its_own(monkeypatch):
    """A second CTranslate2 model that ran on two threads made the English model decode ~2x
    slower for the rest of the process; the detector runs on one, and is never handed out as a
    transcribing engine (its own cache role)."""
    from types import SimpleNamespace

    from taskrun import pipelines
    from taskrun.pipelines.speech import ct2_engine

    made, roles = [], []

    class Fake:
        runtime = "ctranslate2"

        def __init__(self, card, device, dtype, threads=None):
            made.append(threads)

        def detect_language(self, samples):
            return "de", 0.99

    def cached(card, runtime, device, dtype, role, factory):
        roles.append(role)
        return factory()

    monkeypatch.setattr(ct2_engine, "CT2WhisperEngine", Fake)
    monkeypatch.setattr(pipelines, "cached_model", cached)
    monkeypatch.setattr(language, "first_speech", lambda path: np.zeros(16000, np.float32))
    monkeypatch.setattr(language, "resolve", lambda alias, offline=False: SimpleNamespace(name=alias))
    heard = language.detect([SimpleNamespace(path="x.wav")], "whisper-base", "auto", True)
    assert heard == ("x.wav", "de", 0.99) and made == [1] and roles == ["language-detector"]


@pytest.mark.parametrize("speech", [True, False], ids=["speech", "silence"])
def test_the_detector_thread_loads_the_asked_model_while_it_listens(monkeypatch, speech):
    """detect() loads the detector on a thread of its own while the first speech is read, then
    runs ``meanwhile`` (the runner's model load) on that thread while the detector listens, and
    returns once both are done; with no speech there is nothing to detect and nothing to warm."""
    import threading

    from taskrun.tasks.base import Input

    events = []

    class Detector:
        def detect_language(self, samples):
            events.append(("detect", threading.current_thread().name))
            return "en", 0.99

    def load(alias, device, offline):
        events.append(("load detector", threading.current_thread().name))
        return Detector()

    monkeypatch.setattr(language, "_detector", load)
    monkeypatch.setattr(language, "first_speech", lambda path: np.zeros(16000, np.float32) if speech else None)
    warm = lambda: events.append(("warm", threading.current_thread().name))  # noqa: E731
    assert (
        language.detect([Input(source="a.wav", kind="audio", path="a.wav")], "multi", "cpu", True, meanwhile=warm)
        is None
    )  # English: no switch
    main_thread = threading.current_thread().name
    if not speech:
        assert [e for e, _ in events] == ["load detector"]
        return
    assert sorted(e for e, _ in events) == ["detect", "load detector", "warm"]
    where = dict(events)
    assert where["detect"] == main_thread and where["warm"] == where["load detector"] != main_thread


@pytest.mark.parametrize(
    "quick, verdict, heard_s",
    [
        (("en", 0.99), None, [4.0]),  # a clear English on 4 s: settled, no second pass
        (("en", 0.80), None, [4.0, 8.0]),  # unsure: the whole 8 s decides, as before
        (("de", 0.99), ("x.wav", "de", 0.97), [4.0, 8.0]),  # not English: the whole 8 s decides the switch
    ],
)
def test_clear_english_is_settled_on_the_first_seconds(monkeypatch, quick, verdict, heard_s):
    """The detector hears QUICK_S seconds first; only a sure English ends it there. Anything else
    is heard again on all DETECT_S seconds, and that second answer is the one used."""
    from types import SimpleNamespace

    lengths = []

    class Detector:
        def detect_language(self, samples):
            lengths.append(len(samples) / 16000)
            return quick if len(lengths) == 1 else ("de", 0.97) if quick[0] == "de" else ("en", 0.99)

    monkeypatch.setattr(language, "_detector", lambda alias, device, offline: Detector())
    monkeypatch.setattr(language, "first_speech", lambda path: np.zeros(int(language.DETECT_S * 16000), np.float32))
    assert language.detect([SimpleNamespace(path="x.wav")], "multi", "cpu", True) == verdict
    assert lengths == heard_s


def test_a_short_clip_is_heard_once(monkeypatch):
    """Speech no longer than QUICK_S is heard once, whatever the answer."""
    from types import SimpleNamespace

    lengths = []

    class Detector:
        def detect_language(self, samples):
            lengths.append(len(samples))
            return "en", 0.6

    monkeypatch.setattr(language, "_detector", lambda alias, device, offline: Detector())
    monkeypatch.setattr(language, "first_speech", lambda path: np.zeros(3 * 16000, np.float32))
    assert language.detect([SimpleNamespace(path="x.wav")], "multi", "cpu", True) is None
    assert lengths == [3 * 16000]
