"""The server's SRT equals the CLI's on the same audio (issue 30: cue times 06,131 vs 06,268):
both decode with word timestamps, so cues are cut between the same words at the same times."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.serve_helpers import RUN, Server

pytestmark = pytest.mark.real
SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "meeting.wav"


def test_server_srt_equals_cli_srt(tmp_path, session_cache):
    import soundfile as sf

    audio, rate = sf.read(SAMPLE)
    clip = tmp_path / "clip.wav"
    sf.write(clip, audio[: 20 * rate], rate)
    env = dict(os.environ, TASKRUN_LOG_DB=str(tmp_path / "runs.db"), TASKRUN_CACHE_DIR=str(session_cache))
    env.pop("TASKRUN_MODELS_TOML", None)
    env.pop("TASKRUN_API_KEY", None)
    cli = subprocess.run(
        [RUN, "transcribe", str(clip), "--format", "srt"], env=env, capture_output=True, text=True, timeout=300
    )
    assert cli.returncode == 0, cli.stderr
    server = Server(tmp_path, env)
    try:
        server.wait_healthy()
        with open(clip, "rb") as f:
            answer = httpx.post(
                server.url + "/v1/audio/transcriptions",
                files={"file": ("clip.wav", f, "audio/wav")},
                data={"response_format": "srt"},
                timeout=300,
            )
    finally:
        server.stop()
    assert answer.status_code == 200, answer.text
    assert "-->" in cli.stdout
    assert answer.text.strip() == cli.stdout.strip()
