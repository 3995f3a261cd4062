"""The layers under the CLI: sniffing, resolution and digests, the model cache, the run log."""

from __future__ import annotations

import json
import multiprocessing as mp
import sqlite3

import pytest

from taskrun.models import digest as digest_mod
from taskrun.models.resolve import resolve
from taskrun.runner.runlog.store import MIGRATIONS, RunLog
from taskrun.tasks.base import TaskError
from taskrun.tasks.inputs import sniff_bytes
from tests.tiny.bert import build as tiny_bert


@pytest.mark.parametrize(
    "head,kind",
    [
        (b"\x89PNG\r\n\x1a\n....", "image"),
        (b"\xff\xd8\xff\xe0JFIF", "image"),
        (b"RIFF\x00\x00\x00\x00WAVEfmt ", "audio"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "image"),
        (b"fLaC\x00\x00", "audio"),
        (b"OggS\x00\x02", "audio"),
        (b"plain text, caf\xc3\xa9\n", "text"),
        (b"caf\xe9 au lait", "text"),  # latin-1: text, and reading it says how to convert it
        (b"\x01\x02\x03\x04\x05\xe9\x06\x07" * 4, "binary"),
        (b"\x00\x01\x02\x03", "binary"),
    ],
)
def test_sniffing_reads_content_not_names(head, kind):
    assert sniff_bytes(head) == kind


def test_sniff_keeps_a_multibyte_char_cut_at_the_boundary():
    assert sniff_bytes(("a" * 10 + "é").encode()[:-1]) == "text"


def test_digest_is_computed_once_per_version_of_the_files(tiny_dir, tmp_path, monkeypatch):
    folder = tmp_path / "m"
    folder.mkdir()
    for f in tiny_bert(tiny_dir).iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    calls = []
    real = digest_mod.hash_files
    monkeypatch.setattr(digest_mod, "hash_files", lambda *a: calls.append(1) or real(*a))
    first = resolve(str(folder))
    second = resolve(str(folder))
    assert first.digest == second.digest and len(calls) == 1
    (folder / "vocab.txt").write_text((folder / "vocab.txt").read_text() + "extra\n")
    third = resolve(str(folder))
    assert len(calls) == 2 and third.digest != first.digest


def test_model_card_for_a_local_folder(tiny_dir):
    card = resolve(str(tiny_bert(tiny_dir)))
    assert card.architecture == "BertModel" and card.runtime == "transformers"
    assert set(card.tasks) >= {"embed", "search", "classify"} and card.size_bytes > 0
    assert card.source == "local folder"


def test_unknown_model_name_lists_aliases():
    with pytest.raises(TaskError, match="not an alias .*minilm"):
        resolve("no-such-model")


def test_models_are_loaded_once_per_process(tiny_dir):
    from click.testing import CliRunner

    from taskrun import pipelines
    from taskrun.runner.cli import main

    pipelines.clear_cache()
    model = str(tiny_bert(tiny_dir))
    for _ in range(2):
        r = CliRunner().invoke(main, ["embed", "the cat", "--model", model, "--json", "-q"])
        assert r.exit_code == 0, r.output
    loads = [json.loads(m) for m in [r.stdout]]
    assert len([k for k in pipelines._MODELS if k[-1] == "text-encoder"]) == 1
    assert loads[0]["metrics"]["load_s"] < 0.5  # the second job found the weights in the cache


# --------------------------------------------------------------------------- run log


def _writer(path: str, worker: int, n: int) -> None:
    log = RunLog(path)
    for i in range(n):
        log.append(
            {
                "id": f"w{worker}-{i}",
                "started_at": f"2026-01-01T00:00:{i:02d}",
                "task": "embed",
                "status": "ok",
                "metrics": {"wall_s": 0.1},
            }
        )


def test_concurrent_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "runs.db")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert RunLog(path).count() == 160


def test_migrations_bring_an_old_log_up_to_date(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0] + "; PRAGMA user_version = 1;")
    db.execute("INSERT INTO runs (id, started_at, task, status) VALUES ('old', '2025', 'embed', 'ok')")
    db.commit()
    db.close()
    log = RunLog(path)
    assert log.version() == len(MIGRATIONS)
    assert log.get("old")["task"] == "embed"
    log.append({"id": "new", "started_at": "2026", "task": "embed", "status": "ok", "chain_id": "c1", "stage": 0})
    assert log.recent(5, chain_id="c1")[0]["id"] == "new"
