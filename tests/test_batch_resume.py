"""`run batch` loses nothing: a `kill -9` mid-batch and a rerun give every id exactly once; a torn
last line is cut on resume; two runs cannot write one output; memory does not grow with the
input; the pool of processes gives the same lines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskrun.runner.batch.journal import Journal
from taskrun.runner.cli import main
from taskrun.runner.runlog.store import RunLog
from tests.test_batch import RUN, read_jsonl, write_jsonl
from tests.tiny.bert import build as build_bert
from tests.tiny.whisper import build_ct2, clip


def one_thread() -> dict:
    """This test's environment (its run log, cache), on one thread: the tiny models need no
    second one, and on a busy machine torch's thread hand-offs dominate their run time."""
    return dict(os.environ, TASKRUN_THREADS="1")


WORDS = ["the", "cat", "dog", "kitten", "stock", "price", "movie", "good", "bad"]


def embed_jobs(path: Path, n: int, model: str) -> Path:
    rows = [
        {"id": f"s{i}", "task": "embed", "input": f"{WORDS[i % 9]} {WORDS[(i // 9) % 9]} {i}", "model": model}
        for i in range(n)
    ]
    return write_jsonl(path, rows)


@pytest.fixture
def bert(tiny_dir) -> str:
    return str(build_bert(tiny_dir))


def test_kill_9_mid_batch_then_rerun_gives_every_id_once(bert, tmp_path):
    jobs, out = embed_jobs(tmp_path / "jobs.jsonl", 240, bert), tmp_path / "out.jsonl"
    cmd = [RUN, "batch", str(jobs), "-o", str(out), "--chunk", "4", "-q"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=one_thread())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 8:
            break
        time.sleep(0.01)
    proc.kill()  # SIGKILL: no handler, no flush, no summary
    proc.wait()
    assert proc.returncode == -9, proc.stderr.read().decode()
    written = out.read_bytes()
    assert 8 <= written.count(b"\n") < 240, "the kill did not land mid-batch"
    whole = written[: written.rfind(b"\n") + 1]
    assert all(json.loads(line)["status"] == "ok" for line in whole.splitlines())  # nothing half-written
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=one_thread())
    assert again.returncode == 0, again.stderr
    lines = read_jsonl(out)
    counts = Counter(x["id"] for x in lines)
    assert len(counts) == 240 and set(counts.values()) == {1}
    assert all(x["status"] == "ok" for x in lines)
    assert ", 0 failed, " in again.stderr and " skipped " in again.stderr


def test_a_torn_last_line_is_cut_and_its_item_runs_again(bert, tmp_path):
    jobs, out = embed_jobs(tmp_path / "jobs.jsonl", 6, bert), tmp_path / "out.jsonl"
    r = CliRunner().invoke(main, ["batch", str(jobs), "-o", str(out)])
    assert r.exit_code == 0, r.output
    full = out.read_bytes().splitlines(keepends=True)
    for tail in (full[3][:40], b"not json at all\n"):  # cut inside a line; a line that is not JSON
        out.write_bytes(b"".join(full[:3]) + tail)
        r = CliRunner().invoke(main, ["batch", str(jobs), "-o", str(out)])
        assert r.exit_code == 0, r.output
        assert f"1 damaged line(s) of {out} (line 4; {len(tail)} bytes) moved to {out}.damaged" in r.output
        assert "3 ok" in r.output
        lines = read_jsonl(out)
        assert sorted(x["id"] for x in lines) == [f"s{i}" for i in range(6)]
        assert (tmp_path / "out.jsonl.damaged").read_bytes().endswith(tail.rstrip(b"\n") + b"\n")


def test_a_damaged_middle_line_is_set_aside_and_redone(bert, tmp_path):
    """Item 12: a middle line cut to its first 60 bytes still shows its id and status; the
    checksum catches it, so its item runs again and the cut bytes are kept in OUT.damaged."""
    jobs, out = embed_jobs(tmp_path / "jobs.jsonl", 6, bert), tmp_path / "out.jsonl"
    assert CliRunner().invoke(main, ["batch", str(jobs), "-o", str(out)]).exit_code == 0
    full = out.read_bytes().splitlines(keepends=True)
    cut = full[2][:60] + b"\n"
    assert b'"status": "ok"' in cut  # what the old resume read as done
    out.write_bytes(b"".join(full[:2]) + cut + b"".join(full[3:]))
    r = CliRunner().invoke(main, ["batch", str(jobs), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "1 damaged line(s)" in r.output and "(line 3;" in r.output and "1 ok" in r.output
    lines = read_jsonl(out)
    assert sorted(x["id"] for x in lines) == [f"s{i}" for i in range(6)]
    assert all(x["status"] == "ok" and x["result"] for x in lines)
    assert (tmp_path / "out.jsonl.damaged").read_bytes() == cut


def test_a_flipped_byte_in_a_result_is_caught(tmp_path):
    out = tmp_path / "out.jsonl"
    with Journal(out, flavour="taskrun") as j:
        j.write([{"id": i, "task": "embed", "status": "ok", "result": [0.25, 0.5]} for i in "abc"])
    data = out.read_bytes()
    out.write_bytes(data.replace(b"0.25", b"0.35", 1))  # in line 1: still valid JSON
    with Journal(out, flavour="taskrun") as j:
        assert set(j.done) == {"b", "c"} and j.damaged == (1, [1], f"{out}.damaged")
    assert out.read_bytes() == data[data.index(b"\n") + 1 :]


def test_lines_without_checksums_are_read_by_a_full_parse(tmp_path):
    out = tmp_path / "out.jsonl"
    good = json.dumps({"id": "a", "task": "embed", "status": "ok", "result": None, "run_id": "r"}) + "\n"
    out.write_text(good + '{"id": "b", "task": "embed", "status": "ok", "res\n' + good.replace('"a"', '"c"'))
    with Journal(out, flavour="taskrun") as j:
        assert j.done == {"a": True, "c": True} and j.damaged == (1, [2], f"{out}.damaged")
    assert out.read_text().count("\n") == 2


def test_two_runs_cannot_write_one_output(tmp_path):
    out = tmp_path / "out.jsonl"
    with Journal(out, flavour="taskrun"):
        with pytest.raises(Exception, match="being written by another `run batch`"):
            Journal(out, flavour="taskrun")
    Journal(out, flavour="taskrun").close()  # the lock goes with the first


def test_another_batchs_output_is_not_resumed(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text(
        json.dumps({"id": "batch_req_1", "custom_id": "x", "response": {"status_code": 200}, "error": None}) + "\n"
    )
    with pytest.raises(Exception, match="holds openai-format lines"):
        Journal(out, flavour="taskrun")


def peak_rss_mb(jobs: Path, out: Path) -> float:
    r = subprocess.run(
        [RUN, "batch", str(jobs), "-o", str(out), "-q"], capture_output=True, text=True, timeout=300, env=one_thread()
    )
    assert r.returncode == 0, r.stderr
    return max(x["metrics"]["peak_rss_mb"] for x in read_jsonl(out))


def test_memory_does_not_grow_with_the_input(bert, tmp_path):
    """The input streams: 10× the lines, the same peak memory (within 10%)."""
    small = peak_rss_mb(embed_jobs(tmp_path / "1k.jsonl", 1000, bert), tmp_path / "1k.out.jsonl")
    large = peak_rss_mb(embed_jobs(tmp_path / "10k.jsonl", 10_000, bert), tmp_path / "10k.out.jsonl")
    assert large <= small * 1.10, (small, large)


def test_a_pool_of_processes_writes_the_same_lines(tiny_dir, tmp_path):
    whisper = str(build_ct2(tiny_dir))
    rec = tmp_path / "rec"
    rec.mkdir()
    for name in ("a", "b", "c"):
        shutil.copy(clip(tiny_dir), rec / f"{name}.wav")
    out = tmp_path / "out.jsonl"
    r = CliRunner().invoke(
        main,
        [
            "batch",
            "transcribe",
            str(rec),
            "-o",
            str(out),
            "-m",
            whisper,
            "--workers",
            "2",
            "-O",
            "beam_size=1",
            "-O",
            "language=en",
        ],
    )
    assert r.exit_code == 0, r.output
    lines = read_jsonl(out)
    assert sorted(x["id"] for x in lines) == ["a.wav", "b.wav", "c.wav"]
    assert all(x["status"] == "ok" and x["result"]["segments"] for x in lines)
    assert len({x["run_id"] for x in lines}) == 3  # a job each
    summary = next(row for row in RunLog().recent(10) if row["task"] == "batch")
    logged = {row["id"] for row in RunLog().recent(10, chain_id=summary["id"])}  # the pool's rows, logged here
    assert {x["run_id"] for x in lines} <= logged
