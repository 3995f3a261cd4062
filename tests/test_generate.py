"""generate and summarize: the decode loop on a tiny random Llama, the CLI, bad input, real SmolLM2."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.runner.jobs import run_job
from taskrun.tasks import REGISTRY
from taskrun.tasks import events as ev
from taskrun.tasks.base import Input, TaskError, make_options
from tests.tiny.generate import CONTEXT, build

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return str(build(tiny_dir))


@pytest.fixture
def llm(tiny):
    """The tiny model's LLM, copied so a test may change its end-of-sequence ids."""
    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.hf_engine import TransformersLLM

    return copy.copy(TransformersLLM.load(resolve(tiny), "cpu", "float32"))


def _run(tiny, prompt=PROMPT, **opts):
    task = REGISTRY["generate"]
    events = []
    rec = run_job(
        task,
        lambda: [Input(source="arg", kind="text", text=prompt)],
        make_options(task.Options, opts),
        model=tiny,
        on_event=events.append,
    )
    return rec, events


def _decode(llm, ids, **kw):
    from taskrun.pipelines.llm.decode import Decoded
    from taskrun.pipelines.llm.sampling import Sampling
    from taskrun.tasks.clock import Clock

    out = Decoded()
    pieces = list(llm.stream(ids, Sampling(**kw), Clock(), out))
    return out, pieces


def test_tokens_stream_before_the_result_and_add_up_to_it(tiny):
    rec, events = _run(tiny, max_tokens=12, seed=3)
    kinds = [type(e).__name__ for e in events]
    assert kinds[-2:] == ["Item", "Done"] and set(kinds[:-2]) == {"Token"}
    res = rec.results[0]
    assert "".join(e.text for e in events if isinstance(e, ev.Token)) == res.text
    assert res.finish_reason in ("stop", "length")


def test_no_stream_sends_no_tokens(tiny):
    rec, events = _run(tiny, max_tokens=6, stream=False)
    assert not any(isinstance(e, ev.Token) for e in events) and rec.results[0].output_tokens > 0


def test_finish_reason_length_and_stop(llm):
    ids = llm.prompt_ids(PROMPT)
    llm.eos = set()  # never ends by itself: must stop at the limit
    out, _ = _decode(llm, ids, max_tokens=7)
    assert out.finish_reason == "length" and len(out.token_ids) == 7
    llm.eos = {out.token_ids[3]}  # the 4th token now ends the sequence (greedy: same tokens)
    out2, _ = _decode(llm, ids, max_tokens=7)
    assert out2.finish_reason == "stop" and out2.token_ids == out.token_ids[:3]


def test_stop_sequence_cuts_the_text_and_never_streams_it(llm):
    ids = llm.prompt_ids(PROMPT)
    llm.eos = set()
    full, _ = _decode(llm, ids, max_tokens=40)
    assert len(full.text) > 12, full.text
    stop = full.text[8:11]
    out, pieces = _decode(llm, ids, max_tokens=40, stop=(stop,))
    assert out.finish_reason == "stop_sequence"
    assert out.text == full.text[: full.text.find(stop)]
    assert "".join(pieces) == out.text and stop not in "".join(pieces)


def test_same_seed_same_text_other_seed_other_text(tiny):
    a = _run(tiny, max_tokens=20, temperature=1.0, seed=7)[0].results[0]
    b = _run(tiny, max_tokens=20, temperature=1.0, seed=7)[0].results[0]
    c = _run(tiny, max_tokens=20, temperature=1.0, top_p=0.95, top_k=50, seed=8)[0].results[0]
    assert a.text == b.text and a.seed == 7
    assert c.text != a.text


def test_seed_is_reported_when_not_given(tiny):
    a = _run(tiny, max_tokens=10, temperature=1.0)[0].results[0]
    b = _run(tiny, max_tokens=10, temperature=1.0, seed=a.seed)[0].results[0]
    assert a.text == b.text


def test_context_window_is_checked_before_generation(tiny):
    long = " ".join(["the capital of France is Paris"] * 200)
    with pytest.raises(TaskError, match=rf"the prompt is (over )?\d+ tokens.* at most {CONTEXT}.*--truncate"):
        _run(tiny, long)
    rec, _ = _run(tiny, long, truncate=True, max_tokens=5)
    res = rec.results[0]
    assert res.truncated_tokens > 0 and res.input_tokens + 5 <= CONTEXT
    assert rec.metrics.input_tokens == res.input_tokens


def test_metrics_are_consistent(tiny, llm):
    rec, events = _run(tiny, max_tokens=10, seed=1, price_in=2.0, price_out=10.0)
    m, res = rec.metrics, rec.results[0]
    assert m.input_tokens == res.input_tokens == len(llm.prompt_ids(PROMPT))
    assert m.output_tokens == res.output_tokens
    again, _ = _decode(llm, llm.prompt_ids(PROMPT), max_tokens=10)  # greedy: the same tokens
    assert len(again.token_ids) == res.output_tokens and again.text == res.text
    assert 0 < m.prefill_s <= m.ttft_s <= rec.wall_s
    assert m.ttft_s >= rec.load_s
    if res.output_tokens > 1:
        assert m.decode_tokens_per_s > 0
    assert m.finish_reason == res.finish_reason
    assert m.cost == pytest.approx(res.input_tokens * 2e-6 + res.output_tokens * 10e-6)


def test_cli_streams_and_marks_a_cut_answer(tiny):
    r = CliRunner().invoke(main, ["generate", PROMPT, "--model", tiny, "--max-tokens", "3", "-q"])
    assert r.exit_code == 0, r.output
    assert "[cut: stopped at the 3-token limit" in r.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["   "], "empty"),
        (["hi", "--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["hi", "--temperature", "-0.5"], "--temperature must be 0"),
        (["hi", "--top-p", "0"], "--top-p must be in (0, 1]"),
        (["hi", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["hi", "--top-k", "-1"], "--top-k must be 0"),
    ],
)
def test_bad_input_is_one_line_naming_the_fix(tiny, args, message):
    r = CliRunner().invoke(main, ["generate", *args, "--model", tiny, "-q"])
    assert r.exit_code != 0
    assert message in r.output and len(r.output.strip().splitlines()) == 1, r.output


@pytest.mark.parametrize(
    "content,message",
    [
        ("{not json", "is not valid JSON"),
        ('{"type": 5}', "is not a valid JSON Schema"),
        ("[1, 2]", "is not a JSON Schema"),
    ],
)
def test_invalid_json_schema_is_refused_before_loading(tmp_path, content, message):
    f = tmp_path / "schema.json"
    f.write_text(content)
    r = CliRunner().invoke(main, ["generate", "hi", "--json-schema", str(f), "--model", "/nonexistent"])
    assert r.exit_code != 0 and message in r.output, r.output


def test_summarize_map_reduce_keeps_each_stage(tiny):
    text = "\n\n".join(
        f"Paragraph {i}. The meeting decided to ship the release on Friday. Alice owns the budget; Bob owns testing."
        for i in range(30)
    )
    task = REGISTRY["summarize"]
    rec = run_job(
        task,
        lambda: [Input(source="t", kind="text", text=text)],
        make_options(task.Options, {"max_tokens": 8, "context": 256}),
        model=tiny,
    )
    res, m = rec.results[0], rec.metrics
    assert res.chunks > 1 and m.chunks == res.chunks
    assert [s["stage"] for s in m.stages][-1] == "final"
    assert sum(1 for s in m.stages if s["stage"] == "map1") == res.chunks
    assert m.output_tokens == sum(s["output_tokens"] for s in m.stages)
    assert all(s["input_tokens"] + 8 <= 256 for s in m.stages)


def test_summarize_short_text_is_one_pass(tiny):
    r = CliRunner().invoke(
        main, ["summarize", "The release ships on Friday.", "--model", tiny, "--max-tokens", "5", "--json", "-q"]
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["items"][0]["result"]["chunks"] == 1 and len(out["metrics"]["stages"]) == 1


def test_fit_reads_only_the_config(tiny):
    r = CliRunner().invoke(main, ["fit", tiny, "--context", "128", "--batch", "2", "--json"])
    assert r.exit_code == 0, r.output
    est = json.loads(r.stdout)
    # 2 (k and v) × 2 layers × 2 kv heads × head dim 8 × 128 tokens × batch 2 × 4 bytes
    assert est["kv_bytes"] == 2 * 2 * 2 * 8 * 128 * 2 * 4
    assert est["fits"] is True and est["params"] > 0
    r = CliRunner().invoke(main, ["fit", tiny, "--context", "1000000000", "--batch", "64"])
    assert r.exit_code != 0 and "does NOT fit" in r.output


@pytest.mark.real
def test_real_smollm2_knows_the_capital_of_france():
    r = CliRunner().invoke(
        main,
        ["generate", "What is the capital of France?", "--model", "smollm2-135m", "--max-tokens", "24", "--json", "-q"],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert "Paris" in out["items"][0]["result"]["text"]
    assert out["model"]["digest"].startswith("sha256:")  # the GGUF's digest, not the converted folder's
    assert out["model"]["path"].endswith(".gguf")
    m = out["metrics"]
    assert 0 < m["ttft_s"] <= m["wall_s"] and m["output_tokens"] > 0


def test_lean_decoder_matches_transformers_token_for_token(tiny, monkeypatch):
    """The fast Llama forward (float32) gives exactly the tokens of the transformers module."""
    from taskrun.models.resolve import resolve
    from taskrun.pipelines import clear_cache
    from taskrun.pipelines.llm.hf_engine import TransformersLLM

    card = resolve(tiny)
    clear_cache()
    monkeypatch.setenv("TASKRUN_FAST", "0")
    slow = copy.copy(TransformersLLM.load(card, "cpu", "float32"))
    assert slow.fast is None
    clear_cache()
    monkeypatch.setenv("TASKRUN_FAST", "1")
    fast = copy.copy(TransformersLLM.load(card, "cpu", "float32"))
    compact = {}
    for weights in ("float16", "int8"):
        monkeypatch.setenv("TASKRUN_WEIGHTS", weights)
        compact[weights] = copy.copy(TransformersLLM.load(card, "cpu", "auto"))
        clear_cache()
    assert fast.fast is not None and fast.dtype == "float32"
    assert [c.dtype for c in compact.values()] == ["float16", "int8"]
    for llm in (slow, fast, *compact.values()):
        llm.eos = set()
    ids = slow.prompt_ids(PROMPT)
    a, _ = _decode(slow, ids, max_tokens=30)
    b, _ = _decode(fast, ids, max_tokens=30)
    assert a.token_ids == b.token_ids
    for llm in compact.values():  # rounded weights: close, not necessarily equal
        c, _ = _decode(llm, ids, max_tokens=30)
        assert len(c.token_ids) == 30 and c.token_ids[:3] == a.token_ids[:3]


def test_a_temperature_greedy_in_all_but_name_draws_the_top_token():
    """1e-300 divided the logits to inf (inf - inf = nan: a server error through /v1/chat); from
    the largest logit down it is the greedy choice."""
    import torch

    from taskrun.pipelines.llm.sampling import Sampling, sample
    from taskrun.pipelines.llm.speculative import probs

    logits = torch.tensor([0.0, 1.0, 3.0, 2.5])
    for t in (1e-300, 1e-45, 5e-324):
        assert sample(logits, Sampling(temperature=t, top_p=0.9), torch.Generator().manual_seed(0)) == 2
        assert probs(logits.numpy(), Sampling(temperature=t), [])[2] == 1.0


def test_repeat_penalty_and_token_mask_change_the_choice():
    import torch

    from taskrun.pipelines.llm.sampling import Sampling, sample

    logits = torch.tensor([0.0, 1.0, 3.0, 2.5])
    gen = torch.Generator().manual_seed(0)
    assert sample(logits, Sampling(), gen, [2]) == 2
    assert sample(logits, Sampling(repeat_penalty=1.5), gen, [2]) == 3  # 3.0 / 1.5 < 2.5
    allowed = torch.tensor([True, True, False, False])  # a grammar's mask (tests/test_grammar.py)
    assert sample(logits, Sampling(), gen, allowed=allowed) == 1


def test_greedy_on_a_numpy_row_chooses_what_torch_chooses():
    """llama.cpp's logits are numpy and greedy decoding stays in numpy: the same token as the
    torch path for every setting greedy takes (penalty, mask), and a sampled draw on a numpy row
    is the tensor's draw, seed for seed."""
    import numpy as np
    import torch

    from taskrun.pipelines.llm.sampling import Sampling, sample

    rng = np.random.default_rng(0)
    for trial in range(200):
        row = rng.normal(0, 3, 1000).astype(np.float32)
        history = list(rng.integers(0, 1000, 30))
        mask = rng.random(1000) < 0.3
        for settings, allowed in [
            (Sampling(), None),
            (Sampling(repeat_penalty=1.3), None),
            (Sampling(repeat_penalty=0.8), mask),
            (Sampling(), mask),
        ]:
            want = sample(
                torch.from_numpy(row.copy()),
                settings,
                None,
                history,
                None if allowed is None else torch.from_numpy(allowed),
            )
            assert sample(row, settings, None, history, allowed) == want, (trial, settings)
    warm = Sampling(temperature=0.8, top_p=0.9, top_k=50, repeat_penalty=1.1)
    a = [sample(row, warm, torch.Generator().manual_seed(k), history, mask) for k in range(20)]
    b = [
        sample(torch.from_numpy(row), warm, torch.Generator().manual_seed(k), history, torch.from_numpy(mask))
        for k in range(20)
    ]
    assert a == b and len(set(a)) > 1


def test_bad_repeat_penalty_is_refused(tiny):
    r = CliRunner().invoke(main, ["generate", "hi", "--repeat-penalty", "0", "--model", tiny, "-q"])
    assert r.exit_code != 0 and "--repeat-penalty must be from 0.01 to 100" in r.output
