"""`run TASK … --server URL` against a real `run serve` subprocess: the same output as the local
run (results, --json, -o files), errors as one line, nothing logged on the client."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from tests.tiny import bert, generate, models_toml_with, sd, whisper
from tests.tiny.torch_vision import alias, build_efficientnet
from tests.tiny.vision import build_yolos, picture

KEY = "test-key-123"


class Served:
    def __init__(self, url: str, toml: Path, root: Path) -> None:
        self.url, self.toml, self.root = url, toml, root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tiny_dir, session_cache, tmp_path_factory):
    """`run serve` on a free loopback port with a key, serving the tiny models under aliases."""
    import httpx

    root = tmp_path_factory.mktemp("served")
    aliases = {
        "tiny-bert": {"local": str(bert.build(tiny_dir))},
        "tiny-llama": {"local": str(generate.build(tiny_dir))},
        # transformers' Whisper: deterministic on random weights (faster-whisper's temperature
        # fallback samples, so two runs of a random CTranslate2 model differ even locally)
        "tiny-whisper": {"local": str(whisper.build(tiny_dir))},
        "tiny-sd": {"local": str(sd.build(tiny_dir))},
        "tiny-yolos": {"local": str(build_yolos(tiny_dir))},
        **alias(
            "tiny-efficientnet", build_efficientnet(tiny_dir), "EfficientNetLite0", "classify", "image-classification"
        ),
    }
    toml = models_toml_with(aliases, root)
    env = {k: v for k, v in os.environ.items() if k not in ("TASKRUN_SERVER", "TASKRUN_API_KEY")}
    env.update(
        TASKRUN_LOG_DB=str(root / "server.db"),
        TASKRUN_CACHE_DIR=str(session_cache),
        TASKRUN_MODELS_TOML=str(toml),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / "a.md").write_text("the cat sat\n\nthe dog barked\n\nstock prices fell\n")
    port = free_port()
    log = open(root / "server.log", "w")
    cmd = [
        str(Path(sys.executable).parent / "run"),
        "serve",
        "--port",
        str(port),
        "--api-key",
        KEY,
        "--threads",
        "1",
        "--corpus",
        f"docs={corpus}",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the server did not start: " + (root / "server.log").read_text()
            time.sleep(0.3)
        yield Served(url, toml, root)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


@pytest.fixture
def both(served, monkeypatch):
    """Runs a task command locally and on the server, with the same models.toml."""
    monkeypatch.setenv("TASKRUN_MODELS_TOML", str(served.toml))
    monkeypatch.delenv("TASKRUN_SERVER", raising=False)
    monkeypatch.setenv("TASKRUN_API_KEY", KEY)

    def run(args: list[str], remote: bool):
        extra = ["--server", served.url] if remote else []
        return CliRunner().invoke(main, [*args, *extra])

    return run


def same_exit(args, both):
    local, remote = both(args, False), both(args, True)
    assert local.exit_code == remote.exit_code, (local.output, remote.output)
    return local, remote


def jobs(args, both) -> tuple[dict, dict]:
    local, remote = same_exit([*args, "--json", "-q"], both)
    assert local.exit_code == 0, local.output
    return json.loads(local.stdout), json.loads(remote.stdout)


def test_embed_json(both):
    local, remote = jobs(["embed", "the cat", "a dog", "--model", "tiny-bert"], both)
    assert len(local["items"][0]["result"]["vector"]) > 8  # the vectors too: --json prints 6 decimals
    for key in ("task", "status", "error", "runtime", "options", "items", "errors"):
        assert local[key] == remote[key], key
    assert remote["model"]["path"] == ""  # the server keeps its folders to itself (issue 33)
    assert {**local["model"], "path": ""} == remote["model"]
    assert local["metrics"].keys() == remote["metrics"].keys()
    assert local["id"] != remote["id"]


def test_embed_npy(both, tmp_path):
    same_exit(["embed", "the cat", "a dog", "--model", "tiny-bert", "-o", str(tmp_path / "a.npy")], both)
    remote = both(["embed", "the cat", "a dog", "--model", "tiny-bert", "-o", str(tmp_path / "b.npy")], True)
    assert remote.exit_code == 0, remote.output
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    # Identical: the native stream carries full-precision floats and the client keeps them.
    assert np.array_equal(a, b)


def test_generate_text_streams_the_same_words(both):
    args = [
        "generate",
        "What is the capital of France?",
        "--model",
        "tiny-llama",
        "--max-tokens",
        "12",
        "--temperature",
        "0",
        "-q",
    ]
    local, remote = same_exit(args, both)
    assert local.exit_code == 0 and local.stdout.strip()
    assert remote.stdout == local.stdout


@pytest.mark.real  # the packaged whisper-tiny.en: a random CTranslate2 model samples (see above)
def test_transcribe_srt_and_text(both, tiny_dir, tmp_path):
    clip = str(whisper.clip(tiny_dir))  # real speech, cut from samples/meeting.wav
    for name in ("a", "b"):
        result = both(
            ["transcribe", clip, "--model", "whisper-tiny.en", "-o", str(tmp_path / f"{name}.srt")], name == "b"
        )
        assert result.exit_code == 0, result.output
    srt = (tmp_path / "a.srt").read_text()
    assert "-->" in srt and srt == (tmp_path / "b.srt").read_text()
    local, remote = same_exit(["transcribe", clip, "--model", "whisper-tiny.en", "-q"], both)
    assert local.stdout.strip() and remote.stdout == local.stdout


def test_classify_json_results(both, tiny_dir):
    local, remote = jobs(["classify", "good movie", "bad movie", "--labels", "good,bad", "--model", "tiny-bert"], both)
    assert remote["items"] == local["items"] and remote["options"] == local["options"]
    image = str(picture(tiny_dir / "tiny-images"))
    local, remote = jobs(["classify", image, "--model", "tiny-efficientnet", "-k", "3"], both)
    assert remote["items"] == local["items"]
    assert remote["items"][0]["input"] == image  # the local path, not the server's upload


def test_image_png_identical(both, tmp_path):
    args = ["image", "a red fox", "--model", "tiny-sd", "--steps", "2", "--seed", "3"]
    local = both([*args, "-o", str(tmp_path / "a.png")], False)
    remote = both([*args, "-o", str(tmp_path / "b.png")], True)
    assert local.exit_code == remote.exit_code == 0, remote.output
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    assert remote.stdout.strip() == str(tmp_path / "b.png")


def test_a_bad_input_is_the_same_one_line_error(both, tiny_dir, tmp_path):
    image = str(picture(tiny_dir / "tiny-images"))
    local, remote = same_exit(["transcribe", image, "--model", "tiny-whisper"], both)
    assert local.exit_code == 1
    assert remote.output == local.output and image in remote.output
    clip = str(whisper.clip(tiny_dir))  # in a batch: the good one's result, the bad one's error, exit 1
    local, remote = same_exit(["classify", image, clip, "--model", "tiny-efficientnet", "-q"], both)
    assert local.exit_code == 1 and remote.stdout == local.stdout
    assert remote.stderr == local.stderr


def test_a_server_error_is_one_line(both):
    result = both(["embed", "hello", "--model", "no-such-model"], True)
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and "no-such-model" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_missing_key_says_how_to_give_it(served, monkeypatch):
    monkeypatch.delenv("TASKRUN_API_KEY", raising=False)
    result = CliRunner().invoke(main, ["embed", "hello", "--server", served.url])
    assert result.exit_code == 1 and "--api-key" in result.output


def test_nothing_is_logged_here_and_the_servers_run_id_is_shown(both, served, tmp_path, monkeypatch):
    monkeypatch.setenv("TASKRUN_LOG_DB", str(tmp_path / "client.db"))
    result = both(["embed", "hello", "--model", "tiny-bert"], True)
    assert result.exit_code == 0, result.output
    run_id = [line.split()[-1] for line in result.stderr.splitlines() if line.startswith("run id")][0]
    assert not (tmp_path / "client.db").exists()
    with sqlite3.connect(served.root / "server.db") as db:
        assert db.execute("select count(*) from runs where id = ?", (run_id,)).fetchone()[0] == 1


def test_search_names_a_corpus_of_the_server(both, served):
    """The same corpus, named here by its folder and on the server by its --corpus NAME."""
    common = ["search", "cat", "-k", "2", "--model", "tiny-bert", "--json", "-q"]
    local = both([*common, "--corpus", str(served.root / "corpus")], False)
    remote = both([*common, "--corpus", "docs"], True)
    assert local.exit_code == remote.exit_code == 0, remote.output
    local, remote = json.loads(local.stdout), json.loads(remote.stdout)
    assert remote["items"] == local["items"] and remote["options"]["corpus"] == "docs"
    unknown = both(["search", "cat", "--corpus", "nope", "--model", "tiny-bert"], True)
    assert unknown.exit_code == 1 and "docs" in unknown.output


def test_detect_annotates_here(both, tiny_dir, tmp_path):
    image = str(picture(tiny_dir / "tiny-images"))
    args = ["detect", image, "--model", "tiny-yolos", "--threshold", "0", "-q"]
    local = both([*args, "--annotate", str(tmp_path / "a.png")], False)
    remote = both([*args, "--annotate", str(tmp_path / "b.png")], True)
    assert local.exit_code == remote.exit_code == 0, remote.output
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    assert remote.stdout == local.stdout.replace("a.png", "b.png")
