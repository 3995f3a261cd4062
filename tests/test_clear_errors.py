"""User mistakes are one clear line, never `internal error` (issue 14, class 7): chain files of the
wrong shape or types, a TOML nested 100,000 deep, a corpus of special or unreadable files, a
non-finite temperature, a 50 MB argument echoed back, terminal control sequences from inputs, and
folder batches that meet a file they cannot read (reported, the rest finished, exit non-zero)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from tests.tiny.bert import build as tiny_bert

ESC = "\x1b"


@pytest.fixture(scope="module")
def bert(tiny_dir):
    return str(tiny_bert(tiny_dir))


@pytest.fixture
def no_load(monkeypatch):
    import taskrun.pipelines as pipelines

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the mistake was caught")

    monkeypatch.setattr(pipelines, "load_pipeline", boom)


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_clear_line(r) -> str:
    assert r.exit_code == 1, r.output
    assert "internal error" not in r.output and "Traceback" not in r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    return lines[0]


# --------------------------------------------------------------------------- chain files

STEP = '[[steps]]\ntask = "generate"\ninput = "q"\n'
CHAINS = {
    "options as a string": (STEP + 'options = "max_tokens=5"\n', ["step 1 options must be a table"]),
    "int option as a string": (
        STEP + 'options = { max_tokens = "5" }\n',
        ["option max_tokens must be an integer", "step 1 (generate)"],
    ),
    "float option as a string": (STEP + 'options = { temperature = "hot" }\n', ["option temperature must be a number"]),
    "bool option as a number": (STEP + "options = { raw = 1 }\n", ["option raw must be true or false"]),
    "list option as a number": (STEP + "options = { stop = 3 }\n", ["option stop must be an array"]),
    "unknown option": (STEP + "options = { max_token = 5 }\n", ["unknown option max_token"]),
    "task as a number": ('[[steps]]\ntask = 5\ninput = "q"\n', ["step 1 task must be a string"]),
    "steps as a table": ('[steps]\ntask = "generate"\n', ["at least one [[steps]] table"]),
    "step as a string": ('steps = ["generate"]\n', ["step 1 is not a table"]),
    "name as a table": ("name = { a = 1 }\n" + STEP, ["name must be a string"]),
    "input kind not a string": ("inputs = { q = 3 }\n" + STEP, ["input 'q' has kind 3"]),
    "non-finite temperature": (STEP + "options = { temperature = inf }\n", ["--temperature must be 0"]),
}


def _chain_file(tmp: Path, body: str) -> Path:
    p = tmp / "bad.toml"
    p.write_text(("" if "inputs =" in body else 'inputs = { q = "text" }\n') + body)
    return p


@pytest.mark.parametrize("case", list(CHAINS))
def test_a_chain_file_mistake_is_one_line_naming_the_file(case, tmp_path, no_load):
    body, words = CHAINS[case]
    chain = _chain_file(tmp_path, body)
    line = one_clear_line(run("chain", chain, "hello", "-o", tmp_path / "out"))
    for w in words:
        assert w in line
    if case != "non-finite temperature":
        assert str(chain) in line


def test_right_types_pass_the_check_with_int_to_float_and_list_to_tuple(tmp_path):
    from taskrun.runner.chains.run import check_chain, load_chain

    chain = _chain_file(tmp_path, STEP + 'options = { temperature = 1, stop = ["x"], max_tokens = 4 }\n')
    (opts,) = check_chain(load_chain(str(chain)), {"q": "hi"})
    assert opts.temperature == 1.0 and isinstance(opts.temperature, float) and opts.stop == ("x",)


@pytest.mark.parametrize("nest", ["[", "{a="])
def test_a_toml_nested_100000_deep_is_a_clear_error(nest, tmp_path):
    close = {"[": "]", "{a=": "}"}[nest]
    p = tmp_path / "deep.toml"
    p.write_text("x = " + nest * 100_000 + "1" + close * 100_000 + "\n")
    line = one_clear_line(run("chain", p, "hello"))
    assert "too deeply" in line and str(p) in line


def test_a_50_mb_chain_name_is_not_echoed_whole(tmp_path):
    r = run("chain", "x" * 50_000_000, "hello")
    line = one_clear_line(r)
    assert "no chain named" in line and len(r.output) < 1000 and "more characters" in line


# --------------------------------------------------------------------------- terminal escapes


def test_control_sequences_from_an_input_are_escaped_on_the_terminal_but_not_in_json(tmp_path, bert):
    text = f"red {ESC}[31mALERT{ESC}[0m and a bell \a"
    r = run("embed", text, "--model", bert, "-q")
    assert r.exit_code == 0, r.output
    assert ESC not in r.output and "\a" not in r.output and "\\x1b[31mALERT" in r.output
    r = run("embed", text, "--model", bert, "-q", "--json")
    assert json.loads(r.stdout)["items"][0]["result"]["text"] == text  # exact in JSON


def test_control_sequences_in_a_chain_name_are_escaped_in_the_error(tmp_path):
    line = one_clear_line(run("chain", f"{ESC}]0;pwned{ESC}\\{ESC}[2J", "hello"))
    assert ESC not in line and "\\x1b[2J" in line


def test_a_file_output_keeps_the_exact_text(tmp_path, bert):
    notes = tmp_path / "n.txt"
    notes.write_text(f"a {ESC}[1mbold{ESC}[0m passage about moons\n")
    out = tmp_path / "hits.json"
    r = run("search", "moons", "--corpus", notes, "--model", bert, "-q", "-o", out)
    assert r.exit_code == 0, r.output
    assert f"{ESC}[1mbold" in json.loads(out.read_text())["items"][0]["result"]["hits"][0]["text"]


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "-inf"])
def test_a_temperature_that_is_not_a_finite_number_at_least_0_is_refused(value, no_load):
    line = one_clear_line(run("generate", "hi", "--temperature", value))
    assert "--temperature must be 0 (greedy) or a finite number" in line


# --------------------------------------------------------------------------- folders and corpora


def _folder(tmp: Path) -> Path:
    d = tmp / "texts"
    d.mkdir()
    (d / "a.txt").write_text("the cat sat\n")
    (d / "b.txt").write_text("a dog ran\n")
    (d / "latin1.txt").write_bytes("caf\xe9 cr\xe8me au lait, tr\xe8s bon\n".encode("latin-1"))
    os.mkfifo(d / "pipe.txt")
    (d / "zero.txt").symlink_to("/dev/zero")
    return d


def test_a_folder_batch_reports_each_unreadable_file_finishes_the_rest_and_fails(tmp_path, bert):
    d = _folder(tmp_path)
    r = run("embed", "-f", d, "--model", bert, "-q", "--json")
    assert r.exit_code == 1
    out = json.loads(r.stdout)
    assert sorted(Path(i["input"]).name for i in out["items"]) == ["a.txt", "b.txt"]
    failed = {Path(e["input"]).name: e["error"] for e in out["errors"]}
    assert set(failed) == {"latin1.txt", "pipe.txt", "zero.txt"}
    assert "not UTF-8" in failed["latin1.txt"] and "not a regular file" in failed["pipe.txt"]
    assert "3 of 5 inputs failed" in r.stderr and out["status"] == "partial"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file without read permission")
def test_a_file_without_read_permission_in_a_folder_is_reported(tmp_path, bert):
    d = tmp_path / "t"
    d.mkdir()
    (d / "a.txt").write_text("the cat\n")
    (d / "secret.txt").write_text("hidden\n")
    (d / "secret.txt").chmod(0)
    r = run("embed", "-f", d, "--model", bert, "-q")
    assert r.exit_code == 1 and "secret.txt" in r.stderr and "Permission denied" in r.stderr


def test_a_corpus_with_special_files_is_searched_with_a_word_about_the_rest(tmp_path, bert):
    d = _folder(tmp_path)
    r = run("search", "cat", "--corpus", d, "--model", bert, "-q", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    note = [n for n in out["notes"] if "could not be read" in n]
    assert len(note) == 1 and "latin1.txt" in note[0] and out["metrics"]["files"] == 2
    assert r.stderr.count("could not be read") == 1


def test_a_corpus_of_only_special_files_is_a_clear_error(tmp_path, bert):
    d = tmp_path / "dev"
    d.mkdir()
    os.mkfifo(d / "pipe.txt")
    (d / "null").symlink_to("/dev/null")
    line = one_clear_line(run("search", "cat", "--corpus", d, "--model", bert, "-q"))
    assert "holds no text or markdown files" in line


def test_proc_as_a_corpus_ends_with_a_clear_answer():
    """`ask --docs /proc`: walked without following links or reading special files; either a word
    about what was skipped or a clear error, never a crash or a hang."""
    from taskrun.pipelines.text.search import corpus_files
    from taskrun.tasks.base import TaskError

    try:
        files, skipped = corpus_files(Path("/proc"))
    except TaskError as exc:
        assert "--corpus /proc" in str(exc)
    else:
        assert all(f.is_file() for f in files) and skipped
