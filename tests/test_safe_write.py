"""Issue 33 items 3 and 10: the one safe-write path (runner/output/safe.py) that -o, chat's /save,
--out-dir side files, batch --restart and chain artifacts use."""

from __future__ import annotations

import json
import os

import pytest

from taskrun.runner.batch.lines import side_path
from taskrun.runner.commands.chat import Chat, save
from taskrun.runner.output.safe import check_target, file_name, write_file
from taskrun.tasks.base import TaskError
from tests.test_batch import batch, write_jsonl


def _chat() -> Chat:
    return Chat(system="", sampling={}, job={}, turns=[("user", "hi"), ("assistant", "hello")])


def test_save_refuses_a_symlink_and_a_device(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "conv.json"
    link.symlink_to(target)
    with pytest.raises(TaskError, match="/save .* symbolic link"):
        save(_chat(), str(link))
    assert link.is_symlink() and target.read_text() == "keep me"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(TaskError, match="device or special file"):
        save(_chat(), str(fifo))
    assert not fifo.is_file()
    with pytest.raises(TaskError, match="device or special file"):
        check_target("/dev/null", what="/save")
    save(_chat(), str(tmp_path / "ok.json"))
    assert json.loads((tmp_path / "ok.json").read_text())["turns"][0]["content"] == "hi"


def test_a_hard_link_to_an_input_is_the_input(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("data")
    hard = tmp_path / "hard.txt"
    os.link(src, hard)
    with pytest.raises(TaskError, match="by inode"):
        write_file(hard, "x", inputs=(str(src),))
    assert src.read_text() == "data"


def test_restart_does_not_truncate_an_input_hard_linked_as_the_output(tmp_path):
    jobs = write_jsonl(tmp_path / "jobs.jsonl", [{"id": "a", "task": "embed", "input": "x"}])
    before = jobs.read_bytes()
    out = tmp_path / "out.jsonl"
    os.link(jobs, out)
    r = batch(jobs, "-o", out, "--restart")
    assert r.exit_code != 0 and "is the input itself" in r.output
    assert jobs.read_bytes() == before


def test_ids_that_sanitise_alike_get_distinct_names(tmp_path):
    names = {side_path(tmp_path, i, ".srt") for i in ("..", ".", "...", "item", "a b", "a_b")}
    assert len(names) == 6
    assert all(p.is_relative_to(tmp_path) for p in names)
    assert side_path(tmp_path, "sub/b.wav", ".srt") == tmp_path / "sub" / "b.wav.srt"  # a plain id keeps its name


def test_a_300_character_id_gets_a_short_name_with_a_hash(tmp_path):
    a, b = file_name(tmp_path, "x" * 300, ".srt"), file_name(tmp_path, "x" * 299 + "y", ".srt")
    assert a != b and len(a.name.encode()) <= 255
    write_file(a, "1\n")  # no "File name too long"
    assert a.read_text() == "1\n"
    deep = file_name(tmp_path, "é" * 300 + "/" + "z" * 400, ".png")
    assert all(len(p.encode()) <= 255 for p in deep.relative_to(tmp_path).parts)
