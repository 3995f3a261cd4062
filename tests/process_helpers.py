"""Helpers for tests that look at what a job does to its process: which heavy libraries a CLI run
imports, and how large the pictures it decodes are."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

HEAVY = ("torch", "transformers")

_CODE = (
    "import sys\nfrom taskrun.runner.cli import main\n"
    "try:\n    main(sys.argv[1:], standalone_mode=False)\n"
    "finally:\n    print('imported:', sorted(m for m in %r if m in sys.modules), file=sys.stderr)\n"
)


def cli_imports(*args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run `run ARGS` in a fresh Python process: (the finished process, which of HEAVY it had
    imported by the end). The process must succeed and print its result."""
    r = subprocess.run(
        [sys.executable, "-c", _CODE % (HEAVY,), *map(str, args)],
        capture_output=True,
        text=True,
        env=env or dict(os.environ),
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    line = [x for x in r.stderr.splitlines() if x.startswith("imported: ")][-1]
    return r, ast.literal_eval(line.removeprefix("imported: "))


def record_decodes(monkeypatch) -> list[tuple[int | None, tuple[int, int]]]:
    """(fit asked for, size decoded) of every picture tasks/image_files.load_image decodes from
    now on in this test."""
    import taskrun.tasks.image_files as image_files

    decoded: list = []
    load = image_files.load_image

    def spy(path, max_side=None, fit=None):
        img = load(path, max_side, fit)
        decoded.append((fit, img.size))
        return img

    monkeypatch.setattr(image_files, "load_image", spy)
    return decoded
