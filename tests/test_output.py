"""How results leave the runner: files that are the result are written in every output mode."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from taskrun.runner.cli import main


def test_json_mode_still_writes_the_images_and_names_them(tmp_path):
    r = CliRunner().invoke(main, ["image", "--label", "3", "--steps", "2", "--json", "-q", "--out-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)  # stdout holds the JSON alone
    files = out["items"][0]["result"]["images"][0]["files"]
    assert len(files) == 1 and (tmp_path / Path(files[0]).name).exists()


def test_json_with_a_png_output_writes_the_png_and_prints_the_json(tmp_path):
    target = tmp_path / "three.png"
    r = CliRunner().invoke(main, ["image", "--label", "3", "--steps", "2", "--json", "-q", "-o", str(target)])
    assert r.exit_code == 0, r.output
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(r.stdout)["task"] == "image"


def test_an_image_output_with_another_suffix_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = CliRunner().invoke(main, ["image", "--label", "3", "--steps", "2", "-o", str(out / "x.jpg")])
    assert r.exit_code == 1 and "name the output x.png" in r.output
    assert list(out.iterdir()) == []


def test_a_one_input_task_refuses_a_second_input_instead_of_dropping_it(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = CliRunner().invoke(main, ["image", "a 3", "a 7", "--steps", "2", "--out-dir", str(out)])
    assert r.exit_code == 1 and "image takes one input per job, got 2" in r.output
    assert list(out.iterdir()) == []
