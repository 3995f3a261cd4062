"""Two paths that lagged behind the single local task: a chain whose step gave a partial result (a
recording cut short) exits non-zero unless --allow-partial, as `run transcribe` does; and --server
refuses an -o that is one of the job's inputs, as a local run does, before anything is sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskrun.runner.chains.run import allow_partial, load_chain, parse_chain
from taskrun.runner.cli import main
from taskrun.runner.runlog.store import RunLog
from tests.tiny.generate import build as build_llama
from tests.tiny.whisper import SAMPLES, build_ct2

SR = 16000
NOWHERE = "http://127.0.0.1:9"  # nothing listens there: a request sent would fail with "cannot reach"


def _cut_recording(tmp_path: Path, seconds: int = 3) -> Path:
    """meeting.wav cut short as a crash or a full disk leaves it: its header still claims 61 s
    (as test_transcribe's truncated wav)."""
    path = tmp_path / "cut.wav"
    path.write_bytes((SAMPLES / "meeting.wav").read_bytes()[: 44 + seconds * SR * 2])
    return path


def _transcribe_chain(tmp_path: Path, model: Path, options: str = "", then: Path | None = None) -> str:
    """A one-step chain of transcribe (with ``model``), or meeting-notes' two steps with ``then``
    (a generate model) summarising the transcript."""
    f = tmp_path / "t.toml"
    body = (
        f'name = "notes"\ninputs = {{ recording = "audio" }}\n'
        f'[[steps]]\ntask = "transcribe"\ninput = "recording"\noutput = "transcript"\n'
        f'artifact = "transcript.txt"\nmodel = "{model}"\n{options}'
    )
    if then is not None:
        body += (
            f'[[steps]]\ntask = "summarize"\ninput = "transcript"\noutput = "summary"\n'
            f'artifact = "summary.txt"\nmodel = "{then}"\noptions = {{ max_tokens = 6 }}\n'
        )
    f.write_text(body)
    return str(f)


# --------------------------------------------------------------------------- chains and partial results


def test_a_chain_step_with_a_partial_result_exits_1_and_still_writes(tiny_dir, tmp_path):
    chain = _transcribe_chain(tmp_path, build_ct2(tiny_dir), then=build_llama(tiny_dir))
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["chain", chain, str(_cut_recording(tmp_path)), "-o", str(out), "--json"])
    assert r.exit_code == 1, r.output
    last = r.stderr.strip().splitlines()[-1]
    assert "step 1 (transcribe) gave 1 partial result(s)" in last and "--allow-partial" in last
    assert "Traceback" not in r.output and "internal error" not in r.output
    doc = json.loads(r.stdout.strip().splitlines()[-1])  # the chain's JSON still printed
    assert doc["stages"][0]["status"] == "partial"
    assert doc["stages"][1]["status"] == "ok"  # the summary ran on what could be read
    for name in ("transcript.txt", "summary.txt", "chain.json"):  # and all of it is written
        assert (out / name).exists()
    rows = RunLog().recent(5, chain_id=doc["chain_id"])
    assert sorted((row["stage"], row["status"]) for row in rows) == [(0, "partial"), (1, "ok")]


def test_allow_partial_accepts_a_chain_steps_partial_result(tiny_dir, tmp_path):
    chain = _transcribe_chain(tmp_path, build_ct2(tiny_dir))
    out = tmp_path / "out"
    r = CliRunner().invoke(
        main, ["chain", chain, str(_cut_recording(tmp_path)), "-o", str(out), "--allow-partial", "--json"]
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["stages"][0]["status"] == "partial"  # accepted, still logged as what it is
    assert doc["stages"][0]["options"]["allow_partial"] is True
    assert "--allow-partial was given" in r.stderr and (out / "transcript.txt").exists()


def test_a_chain_files_own_allow_partial_option_is_honoured(tiny_dir, tmp_path):
    chain = _transcribe_chain(tmp_path, build_ct2(tiny_dir), "options = { allow_partial = true }\n")
    r = CliRunner().invoke(main, ["chain", chain, str(_cut_recording(tmp_path)), "-o", str(tmp_path / "o"), "-q"])
    assert r.exit_code == 0, r.output


def test_a_whole_recording_in_a_chain_exits_0(tiny_dir, tmp_path):
    import soundfile as sf

    audio, sr = sf.read(str(SAMPLES / "meeting.wav"), frames=3 * SR)
    whole = tmp_path / "whole.wav"
    sf.write(whole, audio, sr)
    chain = _transcribe_chain(tmp_path, build_ct2(tiny_dir))
    r = CliRunner().invoke(main, ["chain", chain, str(whole), "-o", str(tmp_path / "o"), "-q"])
    assert r.exit_code == 0, r.output


def test_allow_partial_reaches_only_the_steps_that_take_it():
    chain = allow_partial(load_chain("meeting-notes"))
    assert chain.steps[0].options == {"speakers": True, "allow_partial": True}
    assert chain.steps[1].options == {"length": "long"}
    assert load_chain("meeting-notes").steps[0].options == {"speakers": True}  # the file's chain is not changed
    overridden = allow_partial(
        parse_chain(
            {
                "inputs": {"r": "audio"},
                "steps": [{"task": "transcribe", "input": "r", "options": {"allow_partial": False}}],
            }
        )
    )
    assert overridden.steps[0].options == {"allow_partial": True}  # the command line wins


def test_ask_takes_no_allow_partial():
    r = CliRunner().invoke(main, ["chain", "--help"])
    assert "--allow-partial" in r.output
    r = CliRunner().invoke(main, ["ask", "--help"])
    assert "--allow-partial" not in r.output


@pytest.mark.real
def test_meeting_notes_on_a_cut_recording_exits_1_unless_allowed(tmp_path):
    clip = _cut_recording(tmp_path, seconds=13)  # the first two sentences, header still 61 s
    out = tmp_path / "notes"
    r = CliRunner().invoke(main, ["chain", "meeting-notes", str(clip), "-o", str(out), "-q"])
    assert r.exit_code == 1 and "step 1 (transcribe)" in r.output and "--allow-partial" in r.output
    assert (out / "transcript.txt").exists() and (out / "summary.txt").exists()
    r = CliRunner().invoke(main, ["chain", "meeting-notes", str(clip), "-o", str(out), "-q", "--allow-partial"])
    assert r.exit_code == 0, r.output


# --------------------------------------------------------------------------- --server and -o


def _notes(tmp_path: Path) -> Path:
    notes = tmp_path / "notes.txt"
    notes.write_text("the meeting moved to friday\n")
    return notes


@pytest.mark.parametrize(
    "args",
    [["summarize", "{notes}"], ["summarize", "-f", "{notes}"], ["generate", "hi", "--json-schema", "{notes}"]],
    ids=["argument", "-f", "json-schema"],
)
def test_server_refuses_an_output_that_is_an_input_before_sending(tmp_path, args):
    notes = _notes(tmp_path)
    before = notes.read_bytes()
    r = CliRunner().invoke(
        main, [a.replace("{notes}", str(notes)) for a in args] + ["-o", str(notes), "--server", NOWHERE]
    )
    assert r.exit_code == 1, r.output
    assert "also an input of this job" in r.output and "Pick another output name" in r.output
    assert "cannot reach" not in r.output and len(r.output.strip().splitlines()) == 1
    assert notes.read_bytes() == before


def test_server_refusal_is_the_local_message(tmp_path, monkeypatch):
    notes = _notes(tmp_path)
    local = CliRunner().invoke(main, ["summarize", str(notes), "-o", str(notes)])
    remote = CliRunner().invoke(main, ["summarize", str(notes), "-o", str(notes), "--server", NOWHERE])
    assert local.exit_code == remote.exit_code == 1
    assert local.output == remote.output


def test_server_corpus_is_a_name_there_not_a_local_input(tmp_path):
    """--corpus names a corpus on the server: a local file of that name is not the job's input,
    so -o over it is not refused as one (the request then goes out, and finds no server)."""
    notes = _notes(tmp_path)
    r = CliRunner().invoke(main, ["search", "q", "--corpus", str(notes), "-o", str(notes), "--server", NOWHERE])
    assert r.exit_code == 1 and "also an input" not in r.output and NOWHERE in r.output


def test_two_names_for_one_file_share_one_server_worker(tiny_dir):
    """The server runs one job at a time per worker; an alias and a path that load the same weights
    get one engine from the model cache, so they must get one worker too: two threads on one
    llama.cpp context would mix their KV caches (the prompt cache keeps it between jobs)."""
    from types import SimpleNamespace

    from taskrun.runner.serve.service import Service
    from taskrun.runner.serve.workers import Workers
    from taskrun.tasks.base import TaskError

    cards = {
        "alias": SimpleNamespace(digest="sha256:aa", path="/m/a.gguf"),
        "/m/a.gguf": SimpleNamespace(digest="sha256:aa", path="/m/a.gguf"),
        "other": SimpleNamespace(digest="sha256:bb", path="/m/b.gguf"),
    }

    def card(name):
        if name not in cards:
            raise TaskError(f"no model named {name}")
        return cards[name]

    service = SimpleNamespace(catalogue=SimpleNamespace(card=card))
    workers = Workers(4, same_as=lambda m: Service._weights_of(service, m))
    assert workers.get("alias") is workers.get("/m/a.gguf")
    assert workers.get("other") is not workers.get("alias")
    assert workers.get("unknown") is not workers.get("alias")  # an unresolvable name keeps its own
    assert set(workers.depth()) == {"alias", "/m/a.gguf", "other", "unknown"}
    workers.close()
    plain = Workers(4)
    assert plain.get("alias") is not plain.get("/m/a.gguf")  # without the mapping: by name, as before
    plain.close()
