"""Safe writes (issue 14, class 1 and 3): every path taskrun writes is checked before any model loads
(a device, a folder, a link, the job's own input, a suffix no format of the task writes, a folder
that cannot take a file), a chain's artifacts stay inside its output folder, and a result whose final
write fails is still shown (stdout, or a temporary file that is named) with a non-zero exit.

The tests may run as root, where permissions do not stop a write: an unwritable folder is made with
/proc (no one can create a file there), a full disk with RLIMIT_FSIZE in a child process, and a
folder removed while the job runs with a hook around the last step."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from tests.tiny.bert import build as tiny_bert


@pytest.fixture(scope="module")
def bert(tiny_dir):
    return str(tiny_bert(tiny_dir))


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if any model is resolved or loaded: the refusal must come before."""
    import taskrun.models.resolve as resolve
    import taskrun.pipelines as pipelines

    def boom(*a, **k):
        raise AssertionError("a model was resolved or loaded before the output was checked")

    monkeypatch.setattr(pipelines, "load_pipeline", boom)
    monkeypatch.setattr(resolve, "resolve", boom)


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _fifo(tmp: Path) -> Path:
    p = tmp / "pipe"
    os.mkfifo(p)
    return p


def _link(tmp: Path) -> Path:
    (tmp / "real.txt").write_text("keep me\n")
    (tmp / "link.txt").symlink_to(tmp / "real.txt")
    return tmp / "link.txt"


def _notes(tmp: Path) -> Path:
    (tmp / "notes.txt").write_text("the meeting moved to friday\n")
    return tmp / "notes.txt"


# (make the -o path, the task's arguments before -o, what the message says)
REFUSALS = {
    "device": (lambda t: Path("/dev/null"), ["summarize", "some text"], "device or special file"),
    "fifo": (_fifo, ["summarize", "some text"], "device or special file"),
    "symlink": (_link, ["summarize", "some text"], "symbolic link"),
    "own input (-f)": (_notes, ["summarize", "-f", "{notes}"], "also an input of this job"),
    "own input (arg)": (_notes, ["summarize", "{notes}"], "also an input of this job"),
    "corpus": (_notes, ["search", "q", "--corpus", "{notes}"], "also an input of this job"),
    "mp3": (lambda t: t / "x.mp3", ["summarize", "some text"], "does not write x.mp3"),
    "png for generate": (lambda t: t / "a.png", ["generate", "hi"], "does not write a.png"),
    "npz": (lambda t: t / "v.npz", ["embed", "some text"], "v.npz"),
    "missing folder": (lambda t: t / "nope" / "x.txt", ["summarize", "some text"], "does not exist"),
    "unwritable folder": (lambda t: Path("/proc/self/out.txt"), ["summarize", "some text"], "not writable"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_an_output_that_would_surprise_is_refused_before_any_model_loads(case, tmp_path, no_load):
    make, args, words = REFUSALS[case]
    out = make(tmp_path)
    notes = tmp_path / "notes.txt"
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and not p.is_symlink()}
    r = run(*[a.replace("{notes}", str(notes)) for a in args], "-o", out)
    assert r.exit_code == 1, r.output
    assert words in r.output and "internal error" not in r.output
    assert len(r.output.strip().splitlines()) == 1  # one clear line
    for p, data in before.items():  # nothing written over
        assert p.read_bytes() == data
    if case == "symlink":
        assert out.is_symlink()


def test_a_folder_as_output_is_refused(tmp_path, no_load):
    r = run("summarize", "some text", "-o", tmp_path)
    assert r.exit_code != 0 and "directory" in r.output
    from taskrun.runner.output.paths import check_output_path
    from taskrun.tasks.base import TaskError

    with pytest.raises(TaskError, match="is a folder"):
        check_output_path(str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_refused_before_loading(tmp_path, no_load):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        r = run("summarize", "some text", "-o", ro / "x.txt")
        assert r.exit_code == 1 and "not writable" in r.output
    finally:
        ro.chmod(0o700)


def test_a_symlink_target_named_directly_is_written(tmp_path, bert):
    """The way to write through a link: name its target (the message says so)."""
    link = _link(tmp_path)
    target = link.resolve().with_suffix(".json")
    link.unlink()
    link.with_suffix(".json").symlink_to(target)
    r = run("embed", "the cat", "--model", bert, "-o", link.with_suffix(".json"), "-q")
    assert r.exit_code == 1 and f"-o {target}" in r.output
    r = run("embed", "the cat", "--model", bert, "-o", target, "-q")
    assert r.exit_code == 0, r.output
    assert json.loads(target.read_text())["task"] == "embed"


def test_an_image_out_dir_that_cannot_be_written_is_refused_before_loading(tmp_path, no_load):
    r = run("image", "--label", "3", "--out-dir", "/proc/self")
    assert r.exit_code == 1 and "--out-dir" in r.output and "not writable" in r.output


@pytest.mark.parametrize("fmt_args,suffix", [([], "txt"), (["--json"], "json")])
def test_a_removed_output_folder_prints_the_result_and_exits_non_zero(fmt_args, suffix, tmp_path, bert, monkeypatch):
    """The folder goes away while the job runs (removed by the hook just before the last step)."""
    import shutil

    import taskrun.runner.commands.task as execute

    folder = tmp_path / "out"
    folder.mkdir()
    real = execute.emit

    def emit_after_removal(*a, **k):
        shutil.rmtree(folder)
        return real(*a, **k)

    monkeypatch.setattr(execute, "emit", emit_after_removal)
    r = run(
        "search",
        "moons",
        "--corpus",
        _notes(tmp_path),
        "--model",
        bert,
        "-q",
        *fmt_args,
        "-o",
        folder / f"hits.{suffix}",
    )
    assert r.exit_code == 1
    assert "could not write" in r.stderr and "printed above on stdout" in r.stderr
    if fmt_args:
        assert json.loads(r.stdout)["task"] == "search"  # the whole result, on stdout
    else:
        assert "meeting moved to friday" in r.stdout


@pytest.mark.parametrize("name,kind", [("v.npy", "bytes"), ("v.csv", "text")])
def test_a_full_disk_keeps_the_result(name, kind, tmp_path, bert, monkeypatch):
    """ENOSPC at the last write: text is printed, bytes are saved to a named temporary file."""
    import errno

    import taskrun.runner.output.writer as output

    def full(path, data, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(output, "atomic_write", full)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    r = run("embed", "the cat", "a dog", "--model", bert, "-q", "-o", tmp_path / name)
    assert r.exit_code == 1 and "No space left on device" in r.stderr
    if kind == "text":
        assert "printed above on stdout" in r.stderr and r.stdout.count("\n") >= 3
    else:
        saved = r.stderr.split("saved in ")[1].split(" instead")[0]
        import numpy as np

        assert np.load(saved).shape[0] == 2


def test_a_file_size_limit_in_a_child_keeps_the_result(tmp_path, bert):
    """A real failing write (EFBIG under RLIMIT_FSIZE, which holds for root too) in a child."""
    out = tmp_path / "v.json"

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))

    env = {**os.environ, "TASKRUN_LOG_DB": str(tmp_path / "runs.db")}
    cmd = [
        str(Path(sys.executable).with_name("run")),
        "embed",
        "the cat",
        "a dog",
        "a bird",
        "--model",
        bert,
        "-q",
        "-o",
        str(out),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=limit, timeout=300, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "could not write" in r.stderr and "File too large" in r.stderr
    assert json.loads(r.stdout)["task"] == "embed" and not out.exists()


# --------------------------------------------------------------------------- chains


def _chain(tmp: Path, artifact: str) -> Path:
    p = tmp / "c.toml"
    p.write_text(
        'name = "c"\ninputs = { q = "text", docs = "path" }\n\n[[steps]]\ntask = "search"\n'
        f'input = "q"\noptions = {{ corpus = "{{docs}}" }}\nartifact = {json.dumps(artifact)}\n'
    )
    return p


@pytest.mark.parametrize(
    "artifact", ["../../escaped.txt", "/tmp/taskrun-escaped.txt", "sub/../../x.txt", "~/x.txt", ""]
)
def test_a_chain_artifact_outside_the_output_folder_is_refused(artifact, tmp_path, no_load):
    chain = _chain(tmp_path, artifact)
    r = run("chain", chain, "q", tmp_path, "-o", tmp_path / "out")
    assert r.exit_code == 1 and "would write outside the output folder" in r.output
    assert str(chain) in r.output and "artifact" in r.output
    assert not Path("/tmp/taskrun-escaped.txt").exists() and not (tmp_path.parent / "escaped.txt").exists()


def test_a_chain_artifact_through_a_link_out_of_the_folder_is_refused(tmp_path, no_load):
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "link").symlink_to(elsewhere)
    r = run("chain", _chain(tmp_path, "link/x.txt"), "q", tmp_path, "-o", out)
    assert r.exit_code == 1 and "leads outside the output folder" in r.output
    assert list(elsewhere.iterdir()) == []


def test_a_chain_artifact_in_a_subfolder_is_written_inside(tmp_path, bert):
    docs = tmp_path / "docs"
    docs.mkdir()
    _notes(docs)
    chain = tmp_path / "c.toml"
    chain.write_text(
        f'name = "c"\ninputs = {{ q = "text", docs = "path" }}\n\n[[steps]]\ntask = "search"\n'
        f'input = "q"\noutput = "hits"\nmodel = "{bert}"\noptions = {{ corpus = "{{docs}}" }}\n'
        f'artifact = "sub/hits.txt"\n'
    )
    r = run("chain", chain, "when is the meeting", docs, "-o", tmp_path / "out", "-q")
    assert r.exit_code == 0, r.output
    assert "friday" in (tmp_path / "out" / "sub" / "hits.txt").read_text()
