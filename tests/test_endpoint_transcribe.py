"""`run transcribe FILE --endpoint URL/v1 --model NAME`: the file uploaded to an OpenAI-compatible
/v1/audio/transcriptions, the answer read back into transcribe's own transcript, so every format
and the run log are a local run's. Against taskrun's own `run serve` in a subprocess (the tiny
whisper, a key from TASKRUN_API_KEY) on loopback, compared with the same file transcribed here by
the same model; the failures against a closed port, a silent socket and the fake OpenAI server.
Offline."""

from __future__ import annotations

import json
import socket

import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.runner.runlog.store import RunLog
from taskrun.tasks.base import TaskError
from taskrun.tasks.transcribe import Segment, Word
from tests.fake_openai import fake_server

KEY = "sk-transcribe-secret-7f3e"


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_dir, session_cache):
    from tests.serve_helpers import Server, models_toml, server_env
    from tests.tiny import whisper

    folder = tmp_path_factory.mktemp("endpoint-transcribe")
    toml = models_toml({"tiny-whisper": {"local": str(whisper.build_ct2(tiny_dir))}}, folder)
    env = {**server_env(folder, session_cache, toml), "TASKRUN_API_KEY": KEY}
    server = Server(folder, env, "--preload", "tiny-whisper")
    try:
        server.wait_healthy()
        yield server, toml, whisper.clip(tiny_dir)
    finally:
        server.stop()


def run(toml, *args, key: str | None = KEY, code: int = 0, log_db=None):
    env = {"TASKRUN_MODELS_TOML": str(toml), "EP_KEY": key}
    if log_db:  # else the test's own log (conftest): a None here would unset it, and the user's log would take the rows
        env["TASKRUN_LOG_DB"] = str(log_db)
    r = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    assert r.exit_code == code, r.output
    assert KEY not in r.output
    return r


def remote(server, *args) -> tuple:
    # (language given: no detector runs for the English-only tiny model, here or on the server)
    return ("--endpoint", server.url + "/v1", "--model", "tiny-whisper", "--api-key-env", "EP_KEY", *args)


LOCAL = ("-m", "tiny-whisper", "--language", "en")


def test_the_endpoint_transcript_is_the_local_one(served, tmp_path):
    server, toml, clip = served
    db = tmp_path / "runs.db"
    here = json.loads(run(toml, "transcribe", str(clip), *LOCAL, "--json", log_db=db).stdout)
    there = json.loads(
        run(toml, "transcribe", str(clip), *remote(server, "--language", "en", "--json"), log_db=db).stdout
    )
    a, b = here["items"][0]["result"], there["items"][0]["result"]
    assert [(s["start"], s["end"], s["text"]) for s in a["segments"]] == [
        (s["start"], s["end"], s["text"]) for s in b["segments"]
    ]
    assert a["segments"] and (a["text"], a["language"], a["audio_s"]) == (b["text"], b["language"], b["audio_s"])
    assert b["source"] == a["source"] and there["metrics"]["audio_s"] == pytest.approx(3.4, abs=0.01)
    assert there["metrics"]["words"] == here["metrics"]["words"] and there["metrics"]["rtf"] > 0
    # text mode: the same lines on stdout, segment by segment
    shown = run(toml, "transcribe", str(clip), *LOCAL, "-q", log_db=db).stdout
    assert run(toml, "transcribe", str(clip), *remote(server, "--language", "en", "-q"), log_db=db).stdout == shown


def test_word_times_and_srt_are_the_local_ones(served, tmp_path):
    server, toml, clip = served
    db = tmp_path / "runs.db"
    words = ("--language", "en", "--word-timestamps", "--json")
    a = json.loads(run(toml, "transcribe", str(clip), *LOCAL, *words[2:], log_db=db).stdout)["items"][0]["result"]
    b = json.loads(run(toml, "transcribe", str(clip), *remote(server, *words), log_db=db).stdout)["items"][0]["result"]
    got = [[(w["word"], w["start"], w["end"]) for w in s["words"]] for s in b["segments"]]
    assert any(got) and got == [[(w["word"], w["start"], w["end"]) for w in s["words"]] for s in a["segments"]]
    run(toml, "transcribe", str(clip), *LOCAL, "-o", str(tmp_path / "here.srt"), log_db=db)
    run(
        toml, "transcribe", str(clip), *remote(server, "--language", "en", "-o", str(tmp_path / "there.srt")), log_db=db
    )
    srt = (tmp_path / "there.srt").read_text()
    assert "-->" in srt and srt == (tmp_path / "here.srt").read_text()
    vtt = run(toml, "transcribe", str(clip), *remote(server, "--language", "en", "--format", "vtt"), log_db=db)
    assert (
        vtt.stdout.startswith("WEBVTT")
        and vtt.stdout == run(toml, "transcribe", str(clip), *LOCAL, "--format", "vtt").stdout
    )


def test_the_run_log_row_says_where_and_what(served, tmp_path):
    server, toml, clip = served
    db = tmp_path / "runs.db"
    out = json.loads(
        run(toml, "transcribe", str(clip), *remote(server, "--language", "en", "--json"), log_db=db).stdout
    )
    row = RunLog(str(db)).recent(1)[0]
    assert row["id"] == out["id"] and row["status"] == "ok" and row["task"] == "transcribe"
    assert row["runtime"] == "endpoint:openai" and row["model_path"] == server.url + "/v1"
    assert row["model"] == "tiny-whisper" and row["device"] == "remote"
    assert row["metrics"]["audio_s"] == pytest.approx(3.4, abs=0.01) and row["metrics"]["rtf"] > 0
    note = " ".join(row["notes"])
    assert "rtf at this client" in note and "retries 0" in note
    assert KEY not in db.read_bytes().decode("latin-1")


def test_a_server_refusal_carries_its_message_and_never_the_key(served, tmp_path):
    server, toml, clip = served
    db = tmp_path / "runs.db"
    # taskrun's server decodes at temperature 0 only: its 400 says so, through this client
    r = run(toml, "transcribe", str(clip), *remote(server, "--temperature", "0.5"), code=1, log_db=db)
    assert f"endpoint openai:{server.url}/v1#tiny-whisper: HTTP 400" in r.output and "temperature" in r.output
    r = run(toml, "transcribe", str(clip), *remote(server), key="sk-wrong-key-0000", code=1, log_db=db)
    assert "HTTP 401" in r.output and "sk-wrong-key-0000" not in r.output
    rows = RunLog(str(db)).recent(5)
    assert [x["status"] for x in rows] == ["failed", "failed"]
    assert KEY not in db.read_bytes().decode("latin-1") and "sk-wrong-key" not in db.read_bytes().decode("latin-1")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on leaving: nothing listens there


def test_a_closed_port_names_the_endpoint(tmp_path, tiny_dir):
    from tests.tiny.whisper import clip

    url = f"http://127.0.0.1:{closed_port()}/v1"
    toml, db = tmp_path / "none.toml", tmp_path / "runs.db"
    r = run(toml, "transcribe", str(clip(tiny_dir)), "--endpoint", url, "--model", "m", code=1, log_db=db)
    assert f"endpoint openai:{url}#m: connection refused" in r.output and "after 2 retries" in r.output
    assert RunLog(str(db)).recent(1)[0]["status"] == "failed"


def test_an_answer_that_is_not_a_transcript_names_the_endpoint(tmp_path, tiny_dir):
    from tests.tiny.whisper import clip

    with fake_server() as (url, fake):  # it answers every POST with a chat stream
        r = run(tmp_path / "none.toml", "transcribe", str(clip(tiny_dir)), "--endpoint", url, "-m", "x", code=1)
    assert f"endpoint openai:{url}#x: not a transcription answer" in r.output and fake.seen == 1


def test_a_silent_server_is_a_timeout_naming_the_endpoint(tiny_dir):
    from taskrun.pipelines.llm.endpoint_client import Endpoint
    from taskrun.pipelines.speech.endpoint_client import transcribe
    from tests.tiny.whisper import clip

    with socket.socket() as s:  # listens, never answers
        s.bind(("127.0.0.1", 0))
        s.listen()
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
        ep = Endpoint("openai", url, "m", timeout_s=0.3, max_retries=0)
        with pytest.raises(TaskError, match=r"endpoint openai:.*#m: no answer within 0.3 s \(timeout\)"):
            transcribe(ep, str(clip(tiny_dir)))


def test_what_an_endpoint_cannot_do_is_refused_by_name(tmp_path, tiny_dir):
    from tests.tiny.whisper import clip

    toml, wav = tmp_path / "none.toml", str(clip(tiny_dir))
    r = run(toml, "transcribe", wav, "--endpoint", "http://127.0.0.1:11434", "--model", "m", code=1)
    assert (
        "Ollama's API has no transcription" in r.output and "/v1" in r.output and "--endpoint-kind openai" in r.output
    )
    v1 = ("--endpoint", "http://127.0.0.1:1/v1", "--model", "m")
    r = run(toml, "transcribe", wav, *v1, "--endpoint-kind", "ollama", code=1)
    assert "Ollama's API has no transcription" in r.output
    r = run(toml, "transcribe", wav, *v1, "--speakers", "--beam-size", "5", "--no-vad", code=1)
    assert "--vad, --beam-size, --speakers: not sent to a transcription endpoint" in r.output
    r = run(toml, "transcribe", wav, *v1, "--device", "cpu", code=1)
    assert "--device" in r.output and "not with --endpoint" in r.output
    r = run(toml, "transcribe", wav, "--prompt", "Tuesday", code=1)
    assert "--prompt: only with --endpoint" in r.output
    r = run(toml, "transcribe", wav, *v1, "--api-key-env", "NOPE_T", code=1)
    assert "NOPE_T" in r.output and "not set" in r.output


def test_words_listed_apart_go_back_to_their_segments():
    from taskrun.pipelines.speech.endpoint_client import with_words

    segs = [Segment(0.0, 1.0, " Hello there."), Segment(1.0, 2.0, " Bye.")]
    spelled = [Word(0.0, 0.4, " Hello", None), Word(0.4, 1.0, " there.", None), Word(1.0, 1.9, " Bye.", None)]
    assert [len(s.words) for s in with_words(segs, spelled)] == [2, 1]
    # OpenAI's words carry no spaces or punctuation: they go by their times
    bare = [Word(0.0, 0.4, "Hello", None), Word(0.4, 1.0, "there", None), Word(1.2, 1.9, "Bye", None)]
    assert [[w.word for w in s.words] for s in with_words(segs, bare)] == [["Hello", "there"], ["Bye"]]
