"""The llama.cpp engine (pipelines/llm/llamacpp.py) on a tiny GGUF built in code (tests/tiny/gguf_llama.py).

The decode-loop tests of tests/test_generate.py are the contract: they run here unchanged on the
llama.cpp engine (this module's ``tiny`` and ``llm`` fixtures hand them the GGUF), and the tiny
GGUF holds the same float32 weights as the tiny HF folder, so both engines must compute the same
function and pick the same tokens.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from tests import test_generate as contract
from tests.tiny.generate import build as build_hf
from tests.tiny.gguf_llama import build as build_gguf

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (`make install` builds it)")


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return str(build_gguf(tiny_dir))


@pytest.fixture
def llm(tiny):
    """The tiny GGUF on llama.cpp, copied so a test may change its end-of-sequence ids."""
    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.llamacpp import LlamaCppEngine

    return copy.copy(LlamaCppEngine.load(resolve(tiny), "cpu", "auto"))


@pytest.fixture
def hf(tiny_dir):
    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.hf_engine import TransformersLLM

    # a copy: tests change its eos, which must not leak into the process-wide model cache
    return copy.copy(TransformersLLM.load(resolve(str(build_hf(tiny_dir))), "cpu", "float32"))


# The existing decode-loop contract, run on the llama.cpp engine.
test_tokens_stream_before_the_result_and_add_up_to_it = contract.test_tokens_stream_before_the_result_and_add_up_to_it
test_no_stream_sends_no_tokens = contract.test_no_stream_sends_no_tokens
test_finish_reason_length_and_stop = contract.test_finish_reason_length_and_stop
test_stop_sequence_cuts_the_text_and_never_streams_it = contract.test_stop_sequence_cuts_the_text_and_never_streams_it
test_same_seed_same_text_other_seed_other_text = contract.test_same_seed_same_text_other_seed_other_text
test_seed_is_reported_when_not_given = contract.test_seed_is_reported_when_not_given
test_context_window_is_checked_before_generation = contract.test_context_window_is_checked_before_generation
test_metrics_are_consistent = contract.test_metrics_are_consistent


def test_a_gguf_runs_on_llama_cpp_by_default_and_the_log_says_so(tiny):
    r = CliRunner().invoke(
        main, ["generate", contract.PROMPT, "--model", tiny, "--max-tokens", "4", "--seed", "1", "--json", "-q"]
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert (out["runtime"], out["device"], out["dtype"]) == ("llama.cpp", "cpu", "f32")
    log = json.loads(CliRunner().invoke(main, ["logs", "show", out["id"]]).stdout)
    assert (log["runtime"], log["dtype"]) == ("llama.cpp", "f32")
    assert log["model_digest"] == out["model"]["digest"] and log["device"] == "cpu"
    from taskrun.pipelines.llm.llamacpp_native import kernel_note

    assert kernel_note() in log["notes"]  # which CPU kernels ran (AVX2, AVX-512, AMX) is on record


def test_the_kernel_level_is_the_best_the_build_has_and_names_what_it_leaves_unused():
    from taskrun.pipelines.llm.llamacpp_native import kernel_level

    avx2 = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | "
    zen3 = {"pni", "ssse3", "avx", "avx2", "fma", "f16c"}
    spr = zen3 | {"avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"}
    assert kernel_level(avx2, zen3) == "llama.cpp CPU kernels: AVX2"
    assert kernel_level(avx2, spr) == (
        "llama.cpp CPU kernels: AVX2 (this CPU also has AMX_INT8, AVX512_BF16, AVX512_VNNI, AVX512, "
        "which this build does not use)"
    )
    native = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | "
    assert kernel_level(native, spr) == "llama.cpp CPU kernels: AMX_INT8"
    assert kernel_level("CPU : LLAMAFILE = 1 | ", set()) == "llama.cpp CPU kernels: generic"


def test_without_llama_cpp_a_gguf_falls_back_to_transformers(tiny, monkeypatch):
    import importlib.util

    from taskrun.models import resolve as res

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    card = res.resolve(tiny)
    assert card.runtime == "transformers" and "llama.cpp" not in card.runtimes
    monkeypatch.undo()
    card = res.resolve(tiny)
    assert card.runtimes[:2] == ("llama.cpp", "transformers")


def test_same_tokens_and_template_as_transformers(llm, hf):
    """Same vocabulary, merges and chat template: the same ids; same float32 weights: the same
    logits (to float rounding) and the same greedy answer."""
    import torch

    for text in (contract.PROMPT, "The meeting decided to ship the release on Friday.", "héllo wörld 42"):
        assert llm.encode(text) == hf.encode(text)
        assert llm.decode(llm.encode(text)) == text
    ids = hf.prompt_ids(contract.PROMPT, system="Be brief.", history=(("user", "Hi"), ("assistant", "Hello")))
    assert llm.prompt_ids(contract.PROMPT, system="Be brief.", history=(("user", "Hi"), ("assistant", "Hello"))) == ids
    assert llm.prompt_ids("x", raw=True, prefix="{") == hf.prompt_ids("x", raw=True, prefix="{")
    a, b = torch.as_tensor(llm.prefill(ids, room=8)), hf.prefill(ids, room=8)  # numpy from llama.cpp
    assert torch.allclose(a, b, atol=2e-2), (a - b).abs().max()  # llama.cpp's KV cache is float16
    for tok in (5, 17, 42):
        a, b = torch.as_tensor(llm.decode_step(tok)), hf.decode_step(tok)
        assert torch.allclose(a, b, atol=2e-2), (a - b).abs().max()
    llm.free(), hf.free()
    llm.eos = hf.eos = set()
    got, want = contract._decode(llm, ids, max_tokens=24)[0], contract._decode(hf, ids, max_tokens=24)[0]
    assert got.token_ids == want.token_ids and got.text == want.text


def test_end_of_turn_and_special_tokens_come_from_the_gguf(llm, hf):
    im_end = hf.tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end in llm.eos
    assert llm.decode([im_end]) == "" and llm.decode([im_end], skip_special=False) == "<|im_end|>"
    pieces = llm.token_bytes()
    assert len(pieces) == len(llm.token_texts()) == hf.model.config.vocab_size
    assert pieces[im_end] == b"\xff<|im_end|>"
    ids = llm.encode("Paris is the capital of France.")
    assert b"".join(pieces[i] for i in ids) == b"Paris is the capital of France."


def test_score_prefers_the_likelier_continuation(llm, hf):
    ids = llm.prompt_ids(contract.PROMPT)
    cont = llm.encode(" Paris")
    assert llm.score(ids, cont) == pytest.approx(hf.score(ids, cont), abs=1e-2)


def test_unsupported_choices_name_the_fix(tiny, tiny_dir):
    for args, message in ((["--dtype", "float32"], "--runtime transformers"), (["--device", "cuda"], "--device cpu")):
        r = CliRunner().invoke(main, ["generate", "hi", "--model", tiny, "--runtime", "llama.cpp", "-q", *args])
        assert r.exit_code != 0 and message in r.output, r.output
    r = CliRunner().invoke(main, ["generate", "hi", "--model", str(build_hf(tiny_dir)), "--runtime", "llama.cpp", "-q"])
    assert r.exit_code != 0 and "transformers" in r.output, r.output


def test_nothing_reaches_stderr_under_quiet(tiny, tmp_path):
    """llama.cpp prints its load log from C; under -q stderr stays empty (a separate process, so
    the C-level stream is the real one)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TASKRUN_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "run"),
            "generate",
            "hi",
            "--model",
            tiny,
            "--max-tokens",
            "3",
            "-q",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    noise = [x for x in r.stderr.splitlines() if x and not x.startswith("[cut: ")]  # taskrun's own notice
    assert noise == [] and r.stdout.strip(), r.stderr


def test_greedy_jobs_on_llama_cpp_never_import_torch(tiny, tmp_path):
    """llama.cpp hands the decode loop numpy logits and greedy decoding stays in numpy, so a
    `run generate` on it (also held to a JSON schema) never imports torch: ~2 s of a cold
    start. A sampled draw may (it goes through torch, so that a seed means the same draw on
    every engine)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TASKRUN_CACHE_DIR=str(tmp_path / "cache"))
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}))
    from tests.process_helpers import cli_imports

    for extra in ([], ["--json-schema", schema, "--max-tokens", "24"], ["--repeat-penalty", "1.3"]):
        r, heavy = cli_imports("generate", "hi", "--model", tiny, "--max-tokens", "4", "-q", *extra, env=env)
        assert "torch" not in heavy, (extra, r.stderr)


def test_a_broken_gguf_is_a_clear_error(tiny, tmp_path):
    bad = tmp_path / "broken.gguf"
    data = open(tiny, "rb").read()
    bad.write_bytes(data[: len(data) // 2])  # a header that promises tensors the file lacks
    r = CliRunner().invoke(main, ["generate", "hi", "--model", str(bad), "--runtime", "llama.cpp", "-q"])
    assert r.exit_code != 0 and "re-download" in r.output, r.output


@pytest.mark.real
@pytest.mark.parametrize("args", [["The capital of France is", "--raw"], ["What is the capital of France?"]])
def test_real_smollm2_gguf_on_llama_cpp_knows_paris(args):
    """The chat question is a near tie between "The" and "L'" at the first token (0.09 apart in
    float32): the float16 prompt copy keeps it; the 4-bit pass alone flips it."""
    r = CliRunner().invoke(main, ["generate", *args, "--model", "smollm2-135m", "--max-tokens", "12", "--json", "-q"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["runtime"] == "llama.cpp" and out["dtype"] == "q4_1"
    assert "Paris" in out["items"][0]["result"]["text"]


@pytest.fixture(scope="module")
def tiny_q4(tiny, tiny_dir):
    """The tiny GGUF quantised to Q4_1 by llama.cpp's own quantizer (the packaged model's format)."""
    import ctypes

    from taskrun.pipelines.llm.llamacpp_native import library

    path = tiny_dir / "tiny-llama-q4_1.gguf"
    if not path.exists():
        lib = library()
        params = lib.llama_model_quantize_default_params()
        params.ftype, params.nthread = 3, 1  # MOSTLY_Q4_1
        assert lib.llama_model_quantize(tiny.encode(), str(path).encode(), ctypes.byref(params)) == 0
    return str(path)


def test_prompts_read_from_a_float16_copy_and_decode_from_the_4bit_file(tiny_q4, monkeypatch):
    """A small 4-bit GGUF reads prompts from a float16 copy made once in the cache (the same 4-bit
    values, exactly); its KV cache moves to the 4-bit model, which decodes. The answer is the one
    without the copy, to within the 4-bit pass's 8-bit rounding of activations."""
    import torch

    from taskrun.models.resolve import cache_dir, resolve
    from taskrun.pipelines.llm.llamacpp import LlamaCppEngine

    monkeypatch.setenv("TASKRUN_PROMPT_CACHE", "0")  # the same prompt twice: read it twice
    card = resolve(tiny_q4)
    llm = copy.copy(LlamaCppEngine.load(card, "cpu", "auto"))
    assert llm.dtype == "q4_1" and card.runtime == "llama.cpp"
    ids = llm.prompt_ids(" ".join(["The capital of France is Paris."] * 12))
    with_copy = [llm.prefill(ids, room=4)] + [llm.decode_step(t) for t in (5, 17)]
    llm.free()
    assert llm.prompt_native is not None and list((cache_dir() / "llamacpp").glob("*.f16.gguf"))
    helper, llm.prompt_native = llm.prompt_native, None
    without = [llm.prefill(ids, room=4)] + [llm.decode_step(t) for t in (5, 17)]
    llm.free()
    llm.prompt_native = helper
    for a, b in zip(with_copy, without):
        assert int(a.argmax()) == int(b.argmax())
        # a lost KV cache would give cosine ~0.5
        assert float(torch.nn.functional.cosine_similarity(torch.as_tensor(a), torch.as_tensor(b), dim=0)) > 0.99
    monkeypatch.setenv("TASKRUN_PROMPT_COPY", "0")
    fresh = LlamaCppEngine(llm.lib, llm.native, {"general.file_type": 3}, card.digest)
    assert not fresh._copy_wanted


def test_json_schema_is_valid_by_construction_on_llama_cpp(tiny, tmp_path):
    """The grammar (pipelines/llm/grammar.py) reads the engine's token bytes: nested JSON on the
    tiny random model is valid on every seed."""
    schema = tmp_path / "s.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "required": ["items"],
                "additionalProperties": False,
                "properties": {
                    "items": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 2,
                        "items": {
                            "type": "object",
                            "required": ["kind", "n"],
                            "additionalProperties": False,
                            "properties": {
                                "kind": {"enum": ["a", "b"]},
                                "n": {"type": "integer", "minimum": 0, "maximum": 99},
                            },
                        },
                    }
                },
            }
        )
    )
    for seed in range(3):
        r = CliRunner().invoke(
            main,
            [
                "generate",
                "List things.",
                "--model",
                tiny,
                "--json-schema",
                str(schema),
                "--temperature",
                "1.0",
                "--seed",
                str(seed),
                "--max-tokens",
                "200",
                "--json",
                "-q",
            ],
        )
        assert r.exit_code == 0, r.output
        res = json.loads(r.stdout.strip().splitlines()[-1])["items"][0]["result"]
        assert res["schema_valid"] is True, res["text"]
        assert all(x["kind"] in ("a", "b") for x in json.loads(res["text"])["items"])


def test_a_damaged_prompt_copy_falls_back_and_is_remade(tiny_q4, monkeypatch):
    from taskrun.models.gguf import gguf_metadata
    from taskrun.models.resolve import cache_dir, resolve
    from taskrun.pipelines.llm.llamacpp import LlamaCppEngine

    monkeypatch.setenv("TASKRUN_PROMPT_CACHE", "0")  # the same prompt twice: read it twice
    card = resolve(tiny_q4)
    loaded = LlamaCppEngine.load(card, "cpu", "auto")
    folder = cache_dir() / "llamacpp"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.f16.gguf"):
        old.unlink()
    broken = folder / f"{card.digest.replace('sha256:', '')[:32]}.f16.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)  # a truncated file, as a crash or a full disk leaves
    llm = LlamaCppEngine(loaded.lib, loaded.native, gguf_metadata(tiny_q4), card.digest)
    long = llm.prompt_ids(" ".join(["The capital of France is Paris."] * 12))
    plain = copy.copy(loaded)
    plain.prompt_native, plain._copy_wanted = None, False
    want = plain.prefill(long)
    plain.free()
    got = llm.prefill(long)  # reads the prompt from the 4-bit file itself
    llm.free()
    assert llm.prompt_native is None and not broken.exists()
    assert int(got.argmax()) == int(want.argmax())


def test_a_batched_sequence_reads_its_prompt_on_the_float16_copy_as_a_lone_one_does(tiny_q4, monkeypatch):
    """The server's batch (llamacpp_batch.py) reads a prompt where the single-stream path does,
    on the float16 copy, so the logits after it are the lone path's bit for bit: cold, and on
    top of a kept prefix. Read on the 4-bit model instead (as before), answers at temperature 0
    parted from the CLI's (smollm2-135m: 6 of the 24 eval cases; tests/test_batch_real.py checks
    the real model through a real server)."""
    import numpy as np

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.llamacpp import LlamaCppEngine
    from taskrun.pipelines.llm.llamacpp_batch import BatchEngine
    from taskrun.tasks.seq_batch import Join

    monkeypatch.setenv("TASKRUN_PROMPT_CACHE", "0")
    llm = copy.copy(LlamaCppEngine.load(resolve(tiny_q4), "cpu", "auto"))
    first = llm.prompt_ids(" ".join(["The capital of France is Paris."] * 12))
    second = first + llm.prompt_ids(" And the capital of Norway is Oslo.")[1:]
    lone = [llm.prefill(first).copy(), llm.prefill(second).copy()]
    llm.free()
    assert llm.prompt_native is not None
    batch = BatchEngine(llm, Join(3))
    assert batch.plain_kv
    slot = batch.slots[2]  # not stream 0: the state moves between 1 and 3 streams
    cold = batch.prefill(slot, first, 0, None)
    assert np.array_equal(cold, lone[0]) and slot.tokens == first
    kept = batch.prefill(slot, second, len(first), None)  # its prefix went to the copy and back
    assert slot.tokens == second
    # the cold read and the kept prefix give the lone path's reads: equal up to the chunking of
    # the second read (the lone one read it whole), so compare its choice, and the cold read exactly
    assert int(kept.argmax()) == int(lone[1].argmax())
    assert float(np.dot(kept, lone[1]) / np.linalg.norm(kept) / np.linalg.norm(lone[1])) > 0.999


def test_restream_moves_one_sequence_between_kv_layouts():
    from taskrun.pipelines.llm.kv_state import restream

    def u32(*xs):
        return b"".join(x.to_bytes(4, "little") for x in xs)

    cells = u32(2) + b"cells-and-data"
    one = u32(0xAF143CD8, 0, 1) + cells  # a context with one stream, sequence 0
    three = restream(one, 1, 0, 3, 2)
    assert three == u32(0xAF143CD8, 2, 3, 0, 0) + cells
    assert restream(three, 3, 2, 1, 0) == one
    assert restream(u32(1) + cells, 1, 0, 2, 1) == u32(2, 0) + cells  # no tag before it
    assert restream(u32(1) + cells, 1, 0, 2, 0) == u32(2) + cells + u32(0)
    assert restream(u32(0xAF143CD8, 0, 2) + cells, 1, 0, 3, 0) is None  # not the stream count said
    assert restream(u32(0xAF143CD8, 0, 1, 0), 1, 0, 2, 0) is None  # an empty sequence
    assert restream(u32(0xAF143CD8, 2, 3, 0, 7) + cells, 3, 2, 1, 0) is None  # stream 1 not empty


# ----------------------------------------------------------------- the prompt cache (llamacpp.py, _resume)


def _shared(a, b):
    from taskrun.pipelines.llm.llamacpp import _shared

    return _shared(a, b)


def test_a_prompt_extending_the_last_job_reads_only_its_new_tokens(llm, monkeypatch):
    """Chat turn 2: the conversation so far stays in the KV cache; only the new tokens are read, and
    the answer is the one a cold engine gives (float32 weights: same logits to rounding)."""

    llm.eos = set()
    first, _ = contract._decode(llm, llm.prompt_ids(contract.PROMPT), max_tokens=8)
    ids = llm.prompt_ids("And then?", history=(("user", contract.PROMPT), ("assistant", first.text)))
    kept = _shared(ids, llm.native.tokens)
    assert kept >= len(llm.prompt_ids(contract.PROMPT))  # the whole first prompt at least
    warm_logits = llm.prefill(ids, room=8)
    assert llm.cached_tokens == kept and llm.native.tokens == ids
    warm, _ = contract._decode(llm, ids, max_tokens=8)
    monkeypatch.setenv("TASKRUN_PROMPT_CACHE", "0")
    cold_logits = llm.prefill(ids, room=8)
    assert llm.cached_tokens == 0
    cold, _ = contract._decode(llm, ids, max_tokens=8)
    assert cold.cached_prompt_tokens == 0 and warm.cached_prompt_tokens == len(ids)
    # measured up to 1.3e-3: the answer's KV written a step at a time, not in one batch (float16 cache)
    assert np.allclose(warm_logits, cold_logits, atol=1e-2), np.abs(warm_logits - cold_logits).max()
    assert warm.token_ids == cold.token_ids


def test_a_different_prompt_reuses_nothing(llm):
    contract._decode(llm, llm.prompt_ids("The meeting decided to ship on Friday.", raw=True), max_tokens=4)
    other = llm.prompt_ids("Paris is the capital of France, and Berlin that of Germany.", raw=True)
    assert _shared(other, llm.native.tokens) == 0
    out, _ = contract._decode(llm, other, max_tokens=4)
    assert out.cached_prompt_tokens == 0 and llm.native.tokens[: len(other)] == other


def test_a_shared_prefix_shorter_than_min_reuse_is_read_again(llm):
    from taskrun.pipelines.llm.llamacpp import MIN_REUSE

    long = llm.encode(" ".join(["The meeting decided to ship on Friday."] * 4))
    contract._decode(llm, long, max_tokens=2)
    short = long[: MIN_REUSE - 1] + llm.encode(" Paris")
    llm.prefill(short, room=2)
    assert llm.cached_tokens == 0 and llm.native.tokens == short


def test_an_identical_prompt_gives_the_first_reads_logits_bit_for_bit(llm):

    ids = llm.prompt_ids(contract.PROMPT)
    runs = []
    for _ in range(2):
        runs.append([llm.prefill(ids, room=4)] + [llm.decode_step(t) for t in (5, 17)])
        llm.free()
    assert llm.cached_tokens == len(ids) and llm.native.tokens == ids + [5, 17]
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_the_prompt_cache_is_off_with_taskrun_prompt_cache_0(llm, monkeypatch):
    monkeypatch.setenv("TASKRUN_PROMPT_CACHE", "0")
    ids = llm.prompt_ids(contract.PROMPT)
    for _ in range(2):
        out, _ = contract._decode(llm, ids, max_tokens=3)
        assert out.cached_prompt_tokens == 0
    llm.prefill(ids)
    assert llm.cached_tokens == 0 and llm.native.tokens == ids


def test_a_context_regrown_by_ensure_starts_empty(llm):
    """A job that needs a bigger KV cache gets a new, empty context: nothing is kept from the old one."""
    ids = llm.prompt_ids(contract.PROMPT)
    contract._decode(llm, ids, max_tokens=3)
    native = llm.native
    assert native.tokens[: len(ids)] == ids and native.prompt_end is not None
    llm.prefill(ids, room=native.n_ctx)  # more room than the context has
    assert llm.cached_tokens == 0 and native.tokens == ids and native.n_ctx >= len(ids) + 512
    native.ensure(native.n_ctx * 2)
    assert native.tokens == [] and native.pos == 0 and native.prompt_end is None


def test_kv_left_by_an_interrupted_step_is_cut_before_the_next_prompt(llm, monkeypatch):
    """Ctrl-C between llama_decode and the bookkeeping leaves a position the token list lacks: the
    next prompt still lands right after the kept prefix (the logits a cold read gives)."""

    ids = llm.prompt_ids(contract.PROMPT)
    llm.prefill(ids, room=8)
    llm.decode_step(5)
    del llm.native.tokens[-1]  # as if interrupted: the step's KV is there, its token not recorded
    more = ids + llm.encode(" Paris")
    warm = llm.prefill(more, room=8)
    assert llm.cached_tokens == len(ids)
    monkeypatch.setenv("TASKRUN_PROMPT_CACHE", "0")
    cold = llm.prefill(more, room=8)
    assert np.allclose(warm, cold, atol=1e-2), np.abs(warm - cold).max()


def test_engine_copies_share_one_view_of_the_cache(llm):
    """Copies of an engine (the model cache hands out one; tests and the server copy it) share one
    context: what one read, the other sees and keeps, never a stale list of its own."""
    other = copy.copy(llm)
    ids = llm.prompt_ids(contract.PROMPT)
    contract._decode(llm, ids, max_tokens=3)
    assert other.native is llm.native
    out, _ = contract._decode(other, ids, max_tokens=3)
    assert out.cached_prompt_tokens == len(ids)
    contract._decode(llm, llm.prompt_ids("Something else entirely, a new topic.", raw=True), max_tokens=3)
    out, _ = contract._decode(other, ids, max_tokens=3)
    assert out.cached_prompt_tokens == 0


def test_same_seed_same_text_with_the_float16_prompt_copy(tiny_q4):
    """The 4-bit model reads prompts on its float16 copy: a repeated prompt is answered from the
    first read's logits and KV, so a sampled answer repeats token for token."""
    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.llamacpp import LlamaCppEngine

    llm = copy.copy(LlamaCppEngine.load(resolve(tiny_q4), "cpu", "auto"))
    llm.eos = set()
    ids = llm.prompt_ids(" ".join(["The capital of France is Paris."] * 4))
    a, _ = contract._decode(llm, ids, max_tokens=12, temperature=1.0, seed=3)
    assert llm.prompt_native is not None
    b, _ = contract._decode(llm, ids, max_tokens=12, temperature=1.0, seed=3)
    assert b.cached_prompt_tokens == len(ids) and a.token_ids == b.token_ids
    turn2 = ids + a.token_ids + llm.encode(" And Germany?")
    c, _ = contract._decode(llm, turn2, max_tokens=4)  # the new tokens read on the float16 copy
    assert c.cached_prompt_tokens == len(ids) + len(a.token_ids) - 1  # the last answer token was never read
    assert llm.native.tokens[: len(turn2)] == turn2 and llm.prompt_native.tokens == []


def test_a_cache_disk_too_small_for_the_prompt_copy_is_said_in_the_jobs_notes(tiny_q4, tmp_path):
    """Issue 33 item 19c: with no room for the float16 prompt copy the prompt is read from the
    4-bit weights (the answer can change); the job says so instead of changing path silently. A
    real 1 MB tmpfs as the cache, filled to leave less than the copy needs; the same job on an empty
    one makes the copy and has no such note."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        env = {**os.environ, "TASKRUN_CACHE_DIR": str(disk / "cache"), "TASKRUN_LOG_DB": str(tmp_path / "runs.db")}
        cmd = [str(Path(sys.executable).parent / "run"), "generate", "--model", tiny_q4, "Hello there"]
        cmd += ["--max-tokens", "3", "--temperature", "0"]

        def run() -> subprocess.CompletedProcess:
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)

        roomy = run()
        assert roomy.returncode == 0, roomy.stderr
        assert "prompt copy" not in roomy.stderr and list((disk / "cache" / "llamacpp").glob("*.f16.gguf"))
        for f in (disk / "cache" / "llamacpp").glob("*.f16.gguf"):
            f.unlink()
        with open(disk / "filler", "wb") as f:  # leave ~16 KB: the tiny model's copy needs ~200 KB
            f.write(b"\0" * (1024 * 1024 - 16 * 1024 - os.path.getsize(disk / "cache" / "digests.json")))
        full = run()
        assert full.returncode == 0, full.stderr
        assert "float16 prompt copy" in full.stderr and "4-bit weights" in full.stderr, full.stderr
        assert "MB free" in full.stderr, full.stderr
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_chat_turn_two_reuses_turn_ones_conversation(tiny):
    from taskrun.runner.runlog.store import RunLog

    r = CliRunner().invoke(
        main, ["chat", "--model", tiny, "--max-tokens", "6", "--seed", "1"], input="Hi there\nWhat did I say?\n"
    )
    assert r.exit_code == 0, r.output
    rows = list(reversed(RunLog().recent(10, task="generate")))
    assert len(rows) == 2
    first, second = (x["metrics"] for x in rows)
    assert second["cached_prompt_tokens"] >= first["input_tokens"]
    assert second["cached_prompt_tokens"] < second["input_tokens"]


def test_summarize_counts_the_prompt_tokens_its_stages_kept(tiny):
    """Map-reduce on one engine: each chunk's prompt starts with the previous chunk's template and
    instruction, which the prompt cache keeps; the metric sums the stages' own counts, and the run
    log records it."""
    from taskrun.pipelines.llm.llamacpp import MIN_REUSE
    from taskrun.runner.runlog.store import RunLog

    text = "\n\n".join(
        f"Paragraph {i}. The meeting decided to ship the release on Friday. Alice owns the budget; Bob owns testing."
        for i in range(30)
    )
    r = CliRunner().invoke(
        main, ["summarize", text, "--model", tiny, "--max-tokens", "8", "--context", "256", "--json", "-q"]
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    m = out["metrics"]
    maps = [s for s in m["stages"] if s["stage"] == "map1"]
    assert len(maps) > 1 and all(s["cached_prompt_tokens"] >= MIN_REUSE for s in maps[1:])
    assert all(s["cached_prompt_tokens"] < s["input_tokens"] for s in m["stages"])
    assert m["cached_prompt_tokens"] == sum(s["cached_prompt_tokens"] for s in m["stages"])
    assert 0 < m["cached_prompt_tokens"] < m["input_tokens"]
    logged = RunLog().get(out["id"])["metrics"]
    assert logged["cached_prompt_tokens"] == m["cached_prompt_tokens"]


@pytest.mark.parametrize(
    "others, load, threads",
    [
        (0, 9.0, 2),  # nobody else runnable now, though a minute's load average remembers a busy machine
        (1, 0.0, 1),  # a neighbour that just started: the load average does not know it yet
        (5, 0.0, 1),  # never fewer than one
        (None, 0.2, 2),  # no /proc/loadavg: the load average, this process's own thread in it
        (None, 2.0, 1),
    ],
)
def test_prompt_threads_leave_the_cores_other_processes_run_on_now(monkeypatch, others, load, threads):
    from taskrun.pipelines import device
    from taskrun.pipelines.llm.llamacpp_native import prompt_threads

    monkeypatch.delenv("TASKRUN_THREADS", raising=False)
    monkeypatch.setattr(device, "cpu_threads", lambda: 2)
    monkeypatch.setattr(device, "cpu_count", lambda: 2)
    monkeypatch.setattr(device, "others_running", lambda **kw: others)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert prompt_threads() == threads


def test_prompt_threads_count_free_cores_of_the_whole_machine(monkeypatch):
    """Others running on cores outside this process's affinity leave its own cores free;
    TASKRUN_THREADS overrides the count."""
    from taskrun.pipelines import device
    from taskrun.pipelines.llm.llamacpp_native import prompt_threads

    monkeypatch.setattr(device, "cpu_count", lambda: 16)
    monkeypatch.setattr(device, "others_running", lambda **kw: 14)
    monkeypatch.setenv("TASKRUN_THREADS", "3")  # the override, however busy the machine is
    assert prompt_threads() == 3
    monkeypatch.delenv("TASKRUN_THREADS")
    monkeypatch.setattr(device, "cpu_threads", lambda: 4)
    assert prompt_threads() == 2
    monkeypatch.setattr(device, "others_running", lambda **kw: 3)
    assert prompt_threads() == 4


def test_decode_threads_are_the_free_cores_unless_fixed(monkeypatch):
    """Single-token steps take every core no other process is running on now; TASKRUN_DECODE_THREADS
    fixes the count (0: every core)."""
    from taskrun.pipelines import device
    from taskrun.pipelines.llm.llamacpp_native import decode_threads

    monkeypatch.delenv("TASKRUN_DECODE_THREADS", raising=False)
    monkeypatch.delenv("TASKRUN_THREADS", raising=False)
    monkeypatch.setattr(device, "cpu_threads", lambda: 2)
    monkeypatch.setattr(device, "cpu_count", lambda: 2)
    monkeypatch.setattr(device, "others_running", lambda **kw: 0)
    assert decode_threads() == 2  # a quiet machine: both cores
    monkeypatch.setattr(device, "others_running", lambda **kw: 1)
    assert decode_threads() == 1  # a busy neighbour: ggml's barrier would wait for its core
    monkeypatch.setenv("TASKRUN_DECODE_THREADS", "2")
    assert decode_threads() == 2
    monkeypatch.setenv("TASKRUN_DECODE_THREADS", "0")
    assert decode_threads() == 2


def test_the_decode_thread_count_follows_the_machine_while_it_answers(llm, monkeypatch):
    """The engine looks at the free cores as the answer starts and every RECHECK steps after:
    a neighbour that starts mid-answer takes a thread away, and gives it back when it stops. The
    tokens do not depend on the count."""
    from taskrun.pipelines.llm import llamacpp

    llm.eos = set()
    ids = llm.prompt_ids(contract.PROMPT)
    monkeypatch.setattr(llamacpp, "native_decode_threads", lambda: 1)
    one, _ = contract._decode(llm, ids, max_tokens=3 * llamacpp.RECHECK)
    looks, counts = [], []
    machine = iter([2, 1, 2, 2, 2])  # quiet at the start, busy at the first recheck, then quiet

    def look():
        looks.append(len(looks))
        return next(machine)

    real = llm.native.decode_on
    monkeypatch.setattr(llamacpp, "native_decode_threads", look)
    monkeypatch.setattr(llm.native, "decode_on", lambda n: counts.append(n) or real(n))
    llm.native.clear()  # a fresh prompt read: the same start as the first answer
    moved, _ = contract._decode(llm, ids, max_tokens=3 * llamacpp.RECHECK)
    assert counts == [2, 1, 2]  # at the start, and at steps 16 and 32 of the 47 after the first token
    assert llm.native.n_threads == 2
    assert moved.token_ids == one.token_ids


def test_context_sets_the_jobs_window_and_a_negative_one_is_refused(tiny):
    """`--context N` (Ollama's num_ctx): prompt and answer together fit in N tokens."""
    args = ["generate", contract.PROMPT, "--model", tiny, "--max-tokens", "50", "--seed", "1", "--json", "-q"]
    r = CliRunner().invoke(main, args)
    n = json.loads(r.stdout.strip().splitlines()[-1])["metrics"]["input_tokens"]
    r = CliRunner().invoke(main, [*args, "--context", str(n + 3)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    res = out["items"][0]["result"]
    assert res["output_tokens"] == 3 and res["finish_reason"] == "length"
    r = CliRunner().invoke(main, [*args, "--context", "-1"])
    assert r.exit_code != 0 and "--context -1 is no window" in r.output
