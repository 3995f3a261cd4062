"""Property-based fuzzing (hypothesis) of what taskrun reads from users: audio and image bytes,
sniffing, job-spec JSON, chain TOML, option values (sizes, --size WxH, --stop, every task's
Options). The property is the same everywhere: any input gives a result or a TaskError (a clear,
one-line user error), never another exception (a traceback, an "internal error").

CI runs FUZZ_EXAMPLES examples per property (50 unless TASKRUN_FUZZ_EXAMPLES says more:
``TASKRUN_FUZZ_EXAMPLES=2000 pytest tests/test_fuzz.py``). No deadline: a slow example on a busy
machine is not a failure. A failing example is printed by hypothesis, to be made a fixed case.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskrun.tasks.base import TaskError

pytest_plugins = ["tests.serve_helpers"]

FUZZ_EXAMPLES = int(os.environ.get("TASKRUN_FUZZ_EXAMPLES", "50"))
settings.register_profile(
    "taskrun",
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile("taskrun")


def _file(data: bytes, suffix: str) -> Path:
    fd, name = tempfile.mkstemp(suffix=suffix)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return Path(name)


def _user_error_only(fn, *args):
    """fn(*args), where a TaskError is a fine answer and anything else fails the property."""
    try:
        return fn(*args)
    except TaskError as exc:
        assert str(exc).strip(), "a TaskError must say something"
        return None


@st.composite
def mutated(draw, seeds: list[bytes]):
    """One of ``seeds`` with bytes flipped, a range cut out, or cut short: the damage real files
    get on disks and downloads, close enough to valid that decoders go deep before failing."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 8))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    if data and draw(st.booleans()):
        a = draw(st.integers(0, len(data)))
        b = draw(st.integers(a, min(len(data), a + 4096)))
        del data[a:b]
    if data and draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


# --------------------------------------------------------------------------- audio


def _audio_seeds() -> list[bytes]:
    import soundfile as sf

    t = np.arange(8000) / 16000
    x = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    out = []
    for fmt, sub in [
        ("WAV", "PCM_16"),
        ("WAV", "FLOAT"),
        ("FLAC", "PCM_16"),
        ("OGG", "VORBIS"),
        ("MP3", "MPEG_LAYER_III"),
    ]:
        buf = io.BytesIO()
        sf.write(buf, x, 16000, format=fmt, subtype=sub)
        out.append(buf.getvalue())
    return out


AUDIO_SEEDS = _audio_seeds()


def _decode_audio(path: Path) -> None:
    from taskrun.pipelines.speech import audio
    from taskrun.tasks import get_task
    from taskrun.tasks.inputs import file_input

    inp = file_input(path)
    get_task("transcribe").check_input(inp)  # the header probe, before any model
    stats = audio.ReadStats()
    for block in audio.read_blocks(path, 16000, stats=stats):
        assert block.dtype == np.float32 and np.isfinite(block).all() and np.abs(block).max(initial=0) <= 1.0
    stats.notices(str(path), allowed=False)


@given(mutated(AUDIO_SEEDS))
def test_damaged_audio_decodes_or_is_a_user_error(data):
    path = _file(data, ".wav")
    try:
        _user_error_only(_decode_audio, path)
    finally:
        path.unlink()


@given(st.binary(max_size=4096))
def test_random_bytes_as_audio_are_a_user_error(data):
    path = _file(data, ".ogg")
    try:
        _user_error_only(_decode_audio, path)
    finally:
        path.unlink()


# --------------------------------------------------------------------------- images


def _image_seeds() -> list[bytes]:
    from PIL import Image

    out = []
    for mode, fmt in [
        ("RGB", "PNG"),
        ("RGBA", "PNG"),
        ("P", "PNG"),
        ("RGB", "JPEG"),
        ("L", "GIF"),
        ("RGB", "BMP"),
        ("RGB", "TIFF"),
        ("RGB", "WEBP"),
    ]:
        buf = io.BytesIO()
        img = Image.new(mode, (37, 23), 100)
        img.save(buf, format=fmt)
        out.append(buf.getvalue())
    return out


IMAGE_SEEDS = _image_seeds()


def _decode_image(path: Path) -> None:
    from taskrun.tasks.image_files import load_image, probe_image

    probe_image(path)
    img = load_image(path)
    assert img.mode == "RGB" and img.width > 0 and img.height > 0


@given(mutated(IMAGE_SEEDS))
def test_damaged_images_decode_or_are_a_user_error(data):
    path = _file(data, ".png")
    try:
        _user_error_only(_decode_image, path)
    finally:
        path.unlink()


@given(st.binary(max_size=2048))
def test_sniffing_any_bytes_names_a_kind(data):
    from taskrun.tasks.inputs import sniff_bytes

    assert sniff_bytes(data) in ("image", "audio", "text", "binary")


# --------------------------------------------------------------------------- job specs and chains

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
TASKS = ["embed", "search", "classify", "generate", "summarize", "detect", "transcribe", "image"]


@given(
    st.sampled_from(TASKS),
    st.dictionaries(st.sampled_from(["input", "options", "model", "runtime", "id", "task", "bogus"]), JSON, max_size=5),
)
def test_job_specs_parse_or_are_a_user_error(task, body):
    from taskrun.tasks.wire.jobspec import Uploads, job_from_native

    with Uploads() as uploads:
        spec = _user_error_only(lambda: job_from_native(task, body, uploads=uploads))
    if spec is not None:
        assert spec.task == task and isinstance(spec.options, dict)


@given(st.sampled_from(TASKS), st.dictionaries(st.text(max_size=12), JSON, max_size=4))
def test_any_option_values_make_options_or_a_user_error(task, values):
    from taskrun.tasks import get_task
    from taskrun.tasks.base import make_options

    _user_error_only(make_options, get_task(task).Options, values)


STEP = st.fixed_dictionaries(
    {"task": st.sampled_from(TASKS + ["nope"])},
    optional={
        "input": st.text(max_size=10),
        "options": st.dictionaries(
            st.sampled_from(["max_tokens", "top_k", "threshold", "language", "stop", "size", "x"]), JSON, max_size=3
        ),
        "artifact": st.text(max_size=10),
        "model": st.text(max_size=8),
        "output": JSON,
    },
)
CHAIN = st.fixed_dictionaries(
    {"steps": st.lists(STEP, max_size=3) | JSON},
    optional={"name": JSON, "description": st.text(max_size=10), "inputs": JSON, "extra": JSON},
)


@given(CHAIN)
def test_chains_parse_and_check_or_are_a_user_error(raw):
    from taskrun.runner.chains.run import check_chain, parse_chain

    def parse():
        check_chain(parse_chain(raw, "fuzz.toml"))

    _user_error_only(parse)


@given(st.text(alphabet=st.sampled_from(list("[]{}=\"'.,:#\n \\task=steps[[x]]01") + ["\u00e9"]), max_size=200))
def test_chain_files_of_any_text_are_a_user_error(text):
    from taskrun.runner.chains.run import load_chain

    path = _file(text.encode("utf-8"), ".toml")
    try:
        _user_error_only(load_chain, str(path))
    finally:
        path.unlink()


# --------------------------------------------------------------------------- option values


@given(
    st.one_of(
        st.text(max_size=16),
        st.integers(-(10**12), 10**15),
        st.from_regex(r"\s*\d{0,6}(\.\d{0,3})?\s*[kmgtKMGT]?[iI]?[bB]?\s*", fullmatch=True),
    )
)
def test_byte_sizes_parse_or_are_a_user_error(text):
    from taskrun.models.sizes import format_size, parse_size

    n = _user_error_only(parse_size, text, "--max-memory")
    if n is not None:
        assert n > 0 and format_size(n)


@given(st.one_of(st.text(max_size=14), st.from_regex(r"\s*\d{1,6}\s*[xX×]\s*\d{1,6}\s*", fullmatch=True)))
def test_image_sizes_parse_or_are_a_user_error(text):
    from taskrun.tasks.image import Options, parse_size

    wh = _user_error_only(parse_size, text)
    if wh is not None:
        assert all(v >= 0 for v in wh)
    _user_error_only(lambda: Options(size=text))


@given(
    st.lists(st.text(max_size=8), max_size=4), st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**7)
)
def test_generate_options_are_checked(stop, temperature, max_tokens):
    from taskrun.tasks.generate import Options

    o = _user_error_only(lambda: Options(stop=tuple(stop), temperature=temperature, max_tokens=max_tokens))
    if o is not None:
        assert all(o.stop) and np.isfinite(o.temperature) and o.max_tokens > 0


@given(
    st.lists(st.text(max_size=12), min_size=1, max_size=4),
    st.lists(st.lists(st.floats(width=32), min_size=3, max_size=3), min_size=1, max_size=4),
)
def test_vector_files_round_trip_any_texts_and_numbers(texts, rows):
    def strict(value):
        raise ValueError(f"{value} is not JSON")

    from taskrun.tasks import vector_files

    n = min(len(texts), len(rows))
    texts, vectors = texts[:n], [np.array(r, np.float32) for r in rows[:n]]
    lines = vector_files.to_jsonl(texts, vectors).rstrip("\n").split("\n")
    rows_back = [json.loads(line, parse_constant=strict) for line in lines]  # strict JSON: no NaN or Infinity
    assert [r["text"] for r in rows_back] == texts
    for r, v in zip(rows_back, vectors):
        assert [x if x is not None else float("nan") for x in r["vector"]] == pytest.approx(
            [float(f"{x:.9g}") if np.isfinite(x) else float("nan") for x in v.tolist()], nan_ok=True
        )
    got = np.load(io.BytesIO(vector_files.to_npy(texts, vectors)))
    assert got.shape == (n, 3)
    np.testing.assert_array_equal(got, np.stack(vectors))
    assert len(vector_files.to_csv(texts, vectors).splitlines()) >= n + 1


def test_the_fuzz_budget_is_bounded():
    """CI's budget: a default run stays small; more examples only when asked."""
    if "TASKRUN_FUZZ_EXAMPLES" not in os.environ:
        assert FUZZ_EXAMPLES == 50
    assert settings().deadline is None


@pytest.mark.parametrize("seed", range(len(AUDIO_SEEDS)))
def test_the_audio_seeds_themselves_decode(seed):
    """The fuzzers start from valid files: each must decode cleanly (else every mutation is moot)."""
    path = _file(AUDIO_SEEDS[seed], ".bin")
    try:
        _decode_audio(path)
    finally:
        path.unlink()


def test_a_wav_with_format_code_zero_is_a_user_error():
    """Found by the fuzzer: a 'fmt ' chunk with format code 0 made FFmpeg open an audio stream with
    no decoder (codec_context None), and the probe failed with AttributeError."""
    import struct

    pcm = (np.sin(np.arange(8000) / 5) * 9000).astype("<i2").tobytes()
    body = (
        b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 0, 1, 16000, 32000, 2, 16)
        + b"data"
        + struct.pack("<I", len(pcm))
        + pcm
    )
    _user_error_only(_decode_audio, _file(b"RIFF" + struct.pack("<I", len(body)) + body, ".wav"))


# Found by the property above in CI: a TIFF whose width is stored as a BYTE, which PIL's Image.open
# itself refuses with ValueError("Invalid dimensions") instead of an OSError.
TIFF_BYTE_WIDTH = (
    b"II*\x00\x08\x00\x00\x00\n\x00\x00\x01\x01\x00\x01\x00\x00\x00"
    b"%\x00\x00\x00\x01\x01\x04\x00\x01\x00\x00\x00\x17\x00\x00\x00\x02\x01"
    b"\x03\x00\x03\x00\x00\x00\x86\x00\x00\x00\x03\x01\x03\x00\x01\x00\x00\x00"
    b"\x01\x00\x00\x00\x06\x01\x03\x00\x01\x00\x00\x00\x02\x00\x00\x00\x11\x01"
    b"\x04\x00\x01\x00\x00\x00\x8c\x00\x00\x00\x15\x01\x03\x00\x01\x00\x00\x00"
    b"\x03\x00\x00\x00\x16\x01\x04\x00\x01\x00\x00\x00\x17\x00\x00\x00\x17\x01"
    b"\x04\x00\x01\x00\x00\x00\xf9\t\x00\x00\x1c\x01\x03\x00\x01\x00\x00\x00"
    b"\x01\x00\x00\x00\x00\x00\x00\x00\x08\x00\x08\x00\x08\x00"
)


def test_a_tiff_with_a_width_pil_cannot_read_is_a_user_error():
    from taskrun.tasks.image_files import probe_image

    path = _file(TIFF_BYTE_WIDTH, ".tif")
    try:
        with pytest.raises(TaskError, match="cannot open it as an image, its header is damaged"):
            probe_image(path)
    finally:
        path.unlink()


# --------------------------------------------------------------------------- the HTTP request layer (issue 33)

ROUTES = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/images/generations",
    "/api/generate",
    "/api/chat",
    "/api/embed",
    *(f"/v1/tasks/{t}" for t in ("embed", "search", "classify", "generate", "image", "detect")),
]
FIELDS = ["model", "messages", "prompt", "input", "options", "stream", "max_tokens", "temperature", "top_p"]
FIELDS += ["seed", "stop", "n", "size", "steps", "system", "format", "keep_alive", "stream_options", "bogus"]
SMALL = st.one_of(
    st.integers(-2, 4),
    st.sampled_from([2**64, 10**30, -(2**63), 4.5, float("nan"), float("inf"), "hot", "", "\ud800", "{:>99999}"]),
)
VALUE = st.one_of(
    SMALL,
    JSON,
    st.sampled_from(["tiny-llama", "tiny-bert", "digits-ddpm", "no-such-model"]),
    st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "bot"]), "content": SMALL | JSON}), max_size=3
    ),
    st.dictionaries(
        st.sampled_from(["num_predict", "temperature", "stop", "labels", "template", "seed", "corpus"]),
        SMALL | JSON,
        max_size=3,
    ),
)


@pytest.fixture(scope="module")
def fuzz_server(servers):
    return servers[0]


@settings(max_examples=max(20, FUZZ_EXAMPLES))
@given(st.sampled_from(ROUTES), st.dictionaries(st.sampled_from(FIELDS), VALUE, max_size=6))
def test_any_json_body_on_any_route_is_answered_without_a_5xx(fuzz_server, route, body):
    import httpx

    if "max_tokens" not in body:  # a valid body runs its job: keep it short
        body["max_tokens"] = 2
    if isinstance(body.get("options"), dict):
        body["options"].setdefault("num_predict", 2)
    data = json.dumps(body).encode()  # NaN and Infinity included, as some clients send them
    r = httpx.post(fuzz_server.url + route, content=data, headers={"Content-Type": "application/json"}, timeout=120)
    assert r.status_code < 500, (route, body, r.text)
    assert "Traceback" not in fuzz_server.log(), fuzz_server.log()
