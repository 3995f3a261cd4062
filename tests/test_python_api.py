"""The Python API (runner/api, re-exported by ``import taskrun``): run, stream, load and tasks on
tiny random models of the real architectures, through the same job runner as the CLI: the same
option checks and errors, a run-log row per call, a warm handle that does not load again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import taskrun
from taskrun.runner.runlog.store import RunLog
from taskrun.tasks import events as ev
from tests.tiny.bert import build as build_bert
from tests.tiny.generate import build as build_llm
from tests.tiny.whisper import build_ct2, clip


@pytest.fixture(scope="module")
def llm(tiny_dir):
    return str(build_llm(tiny_dir))


@pytest.fixture(scope="module")
def bert(tiny_dir):
    return str(build_bert(tiny_dir))


@pytest.fixture(scope="module")
def whisper(tiny_dir):
    return str(build_ct2(tiny_dir)), clip(tiny_dir)


def rows() -> list[dict]:
    return RunLog(os.environ["TASKRUN_LOG_DB"]).recent(50)


def test_import_taskrun_is_cheap_and_names_the_api():
    code = "import sys, taskrun; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'taskrun')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['taskrun']"  # nothing but the package itself until a name is used
    assert {"run", "stream", "load", "tasks", "TaskError"} <= set(dir(taskrun))
    assert taskrun.TaskError is __import__("taskrun.tasks.base").tasks.base.TaskError


def test_tasks_lists_what_run_tasks_lists():
    from click.testing import CliRunner

    from taskrun.runner.cli import main

    listed = taskrun.tasks()
    assert [t["task"] for t in listed] == list(taskrun.tasks.REGISTRY)  # the subpackage still reads through
    cli = CliRunner().invoke(main, ["tasks", "--json"])
    import json

    assert json.loads(cli.stdout) == json.loads(json.dumps(listed))


def test_generate_returns_its_generation_with_metrics_run_id_and_a_log_row(llm):
    g = taskrun.run("generate", "What is the capital of France?", model=llm, max_tokens=6, seed=1)
    assert type(g).__name__ == "Generation" and isinstance(g.text, str)
    assert g.metrics.output_tokens <= 6 and g.metrics.wall_s >= g.metrics.load_s >= 0
    assert g.metrics.task.finish_reason == g.metrics.finish_reason
    assert g.job.digest.startswith("sha256:") and g.job.runtime and g.job.device and g.job.dtype
    (row,) = [r for r in rows() if r["id"] == g.run_id]
    assert row["status"] == "ok" and row["task"] == "generate" and row["model_digest"] == g.job.digest
    assert row["options"]["max_tokens"] == 6 and row["runtime"] == g.job.runtime and row["device"] == g.job.device
    again = taskrun.run("generate", "What is the capital of France?", model=llm, max_tokens=6, seed=1)
    assert again.text == g.text and again.run_id != g.run_id  # seeded: the same answer, its own row


def test_stream_yields_the_tokens_the_cli_prints_then_the_result(llm):
    s = taskrun.stream("generate", "Tell me a story", model=llm, max_tokens=8, seed=2)
    events = list(s)
    tokens = [e.text for e in events if isinstance(e, ev.Token)]
    assert tokens and isinstance(events[-1], ev.Done)
    assert "".join(tokens) == s.result.text
    assert s.result.run_id in {r["id"] for r in rows()}


def test_a_stream_stopped_early_stops_the_job_and_logs_it(llm):
    s = taskrun.stream("generate", "Tell me a long story", model=llm, max_tokens=200, seed=3)
    for e in s:
        if isinstance(e, ev.Token):
            break
    s.close()
    (row,) = [r for r in rows() if r["task"] == "generate"]
    assert row["status"] == "interrupted" and "stopped" in row["error"]


def test_a_bad_option_raises_task_error_naming_the_fix_and_is_logged(llm):
    with pytest.raises(taskrun.TaskError, match=r"unknown option max_new_tokens; this task takes: .*max_tokens"):
        taskrun.run("generate", "hi", model=llm, max_new_tokens=5)
    with pytest.raises(taskrun.TaskError, match="temperature"):
        taskrun.run("generate", "hi", model=llm, temperature=-1.0)
    with pytest.raises(taskrun.TaskError, match="unknown option max_new_tokens"):  # raised from the loop
        list(taskrun.stream("generate", "hi", model=llm, max_new_tokens=5))
    assert [r["status"] for r in rows()] == ["failed", "failed", "failed"]
    with pytest.raises(taskrun.TaskError, match="no task named 'transcrib'"):
        taskrun.run("transcrib", "x.wav")
    with pytest.raises(taskrun.TaskError, match="pass a text, a path"):
        taskrun.run("embed", b"bytes", model=llm)
    with pytest.raises(taskrun.TaskError, match="no such file"):
        taskrun.run("transcribe", Path("nowhere.wav"))


def test_embed_a_list_gives_results_in_order(bert):
    out = taskrun.run("embed", ["the cat", "a dog", "stock prices"], model=bert)
    assert isinstance(out, taskrun.Results) and len(out) == 3
    assert [type(e).__name__ for e in out] == ["Embedding"] * 3
    assert out.metrics.items == 3 and out.metrics.dim == len(out[0].vector)
    assert all(e.run_id == out.run_id for e in out)
    one = taskrun.run("embed", "the cat", model=bert, normalize=False)
    assert type(one).__name__ == "Embedding" and one.run_id != out.run_id


def test_classify_texts_zero_shot(bert):
    r = taskrun.run("classify", "good movie", model=bert, labels=["good", "bad"])
    assert type(r).__name__ == "Result" and {lab.label for lab in r.labels} == {"good", "bad"}
    assert r.metrics.items == 1


def test_transcribe_streams_segments_and_returns_a_transcript(whisper):
    model, wav = whisper
    t = taskrun.run("transcribe", Path(wav), model=model)
    assert type(t).__name__ == "Transcript" and t.metrics.audio_s > 0 and t.metrics.rtf > 0
    s = taskrun.stream("transcribe", str(wav), model=model)
    parts = [e.value for e in s if isinstance(e, ev.Partial)]
    assert [p.text for p in parts] == [seg.text for seg in s.result.segments]


class CountingLock:
    """Stands in for the model cache's load lock, which every read of weights takes: counts them."""

    def __init__(self):
        self.loads = 0

    def __enter__(self):
        self.loads += 1

    def __exit__(self, *exc):
        return False


def test_load_keeps_the_model_warm(llm, bert, whisper, monkeypatch):
    import taskrun.pipelines as pipelines

    pipelines.clear_cache()
    lock = CountingLock()
    monkeypatch.setattr(pipelines, "_LOAD_LOCK", lock)
    gen = taskrun.load("generate", llm)
    enc = taskrun.load("embed", bert)
    asr = taskrun.load("transcribe", whisper[0])
    loaded = lock.loads
    assert loaded >= 3 and "generate" in repr(gen)
    a = gen.run("Hello", max_tokens=4, seed=1)
    b = gen.run("Hello again", max_tokens=4, seed=1)
    streamed = "".join(e.text for e in gen.stream("Hello", max_tokens=4, seed=1) if isinstance(e, ev.Token))
    assert streamed == a.text
    enc.run(["x", "y"])
    asr.run(whisper[1])
    assert lock.loads == loaded  # no call read weights again: load() did, once
    assert a.metrics.load_s < 0.5 and b.metrics.load_s < 0.5  # resolution only
    assert len({r["id"] for r in rows()}) == 5  # every call a row; load() itself is not a job
    gen.close()
    gen2 = taskrun.load("generate", llm)  # closed: its weights left the cache and are read again
    assert lock.loads > loaded and gen2.run("Hi", max_tokens=2).text is not None
    with pytest.raises(taskrun.TaskError, match="takes model, runtime"):
        taskrun.load("embed", bert, batch=3)


def test_a_failed_input_in_a_batch_keeps_the_others(bert, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("the cat sat")
    (tmp_path / "notes" / "b.txt").write_bytes(b"caf\xe9 latin-1")
    with pytest.raises(taskrun.UnfinishedJob, match=r"1 of 2 inputs failed \(first: .*b.txt.*UTF-8") as err:
        taskrun.run("embed", tmp_path / "notes", model=bert)
    assert isinstance(err.value, taskrun.TaskError)
    assert len(err.value.results) == 1 and err.value.results.job.status == "partial"
    assert [r["status"] for r in rows()] == ["partial"]


@pytest.mark.real
def test_the_packaged_embedder_from_python():
    cat, kitten, stocks = taskrun.run("embed", ["cat", "kitten", "stock prices"])
    dot = lambda a, b: sum(x * y for x, y in zip(a.vector, b.vector))  # noqa: E731
    assert dot(cat, kitten) > 0.5 > 0.2 > dot(cat, stocks)
    assert cat.job.model == "minilm" and cat.metrics.dim == 384
