"""What makes the transformers runtimes faster on a CPU changes no output: the vocabulary head
stored transposed (pipelines/device.py: transpose_head) gives the same logits from one copy of the weights, in
Whisper and in a causal LM on either of its forward passes, and Whisper's suppressed-token masks
built once per generate call give the same tokens (pipelines/speech/hf_engine.py)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from taskrun.models.resolve import resolve
from taskrun.pipelines.device import transpose_head
from taskrun.pipelines.speech.engine import FileState
from taskrun.pipelines.speech.hf_engine import HFSpeechEngine
from taskrun.tasks.transcribe import Options
from tests.tiny.whisper import build, clip


def test_the_transposed_head_gives_the_same_logits_from_one_copy(tiny_dir):
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration.from_pretrained(build(tiny_dir)).eval()
    feats = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[50257, 50362, 400, 401], [50257, 50362, 402, 403]])
    with torch.inference_mode():
        before = model(input_features=feats, decoder_input_ids=ids).logits
        transpose_head(model)
        after = model(input_features=feats, decoder_input_ids=ids).logits
    assert torch.allclose(before, after, atol=1e-5)
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    assert head.w_t.is_contiguous() and embed.weight.data_ptr() == head.w_t.data_ptr()  # one copy


@pytest.mark.parametrize("fast", ["0", "1"])
def test_a_float32_causal_lm_decodes_with_the_transposed_head_as_with_its_own(tiny_dir, monkeypatch, fast):
    """TASKRUN_FAST=0: the transformers module; 1: the lean Llama pass, which takes the head over."""
    from transformers import AutoModelForCausalLM

    from taskrun.pipelines import clear_cache
    from taskrun.pipelines.llm.hf_engine import TransformersLLM
    from tests.tiny.generate import build as build_llm

    monkeypatch.setenv("TASKRUN_FAST", fast)
    clear_cache()
    llm = TransformersLLM.load(resolve(str(build_llm(tiny_dir))), "cpu", "float32")
    head = llm.model.get_output_embeddings()
    assert hasattr(head, "w_t") and llm.model.get_input_embeddings().weight.data_ptr() == head.w_t.data_ptr()
    plain = AutoModelForCausalLM.from_pretrained(str(build_llm(tiny_dir))).eval()
    ids = llm.prompt_ids("What is the capital of France?")
    with torch.inference_mode():
        want = plain(input_ids=torch.tensor([ids])).logits[0, -1]
        got = llm.prefill(ids)
        assert torch.allclose(got.float(), want, atol=1e-4)
        for _ in range(5):  # a few steps on: the same greedy tokens
            token = int(want.argmax())
            ids.append(token)
            want = plain(input_ids=torch.tensor([ids])).logits[0, -1]
            got = llm.decode_step(token)
            assert int(got.argmax()) == int(want.argmax())
    llm.free()
    clear_cache()


def test_a_model_the_lean_pass_does_not_cover_gets_the_transposed_head_by_default(tiny_dir, monkeypatch):
    """dtype auto picks float16 weights for the lean Llama pass, which packs its own head; a model
    it does not cover runs float32 products on the transformers module, head included."""
    from taskrun.pipelines import clear_cache
    from taskrun.pipelines.llm.hf_engine import TransformersLLM
    from tests.tiny.generate import build as build_llm

    monkeypatch.setattr("taskrun.pipelines.llm.llama_fast.compact_weights", lambda: "float16")
    card = resolve(str(build_llm(tiny_dir)))
    clear_cache()
    lean = TransformersLLM.load(card, "cpu", "auto")
    assert lean.fast is not None and not hasattr(lean.model.get_output_embeddings(), "w_t")
    clear_cache()
    monkeypatch.setattr("taskrun.pipelines.llm.llama_fast.supports", lambda model: False)
    module = TransformersLLM.load(card, "cpu", "auto")
    assert module.fast is None and hasattr(module.model.get_output_embeddings(), "w_t")
    clear_cache()


@pytest.fixture()
def engine(tiny_dir):
    return HFSpeechEngine(resolve(str(build(tiny_dir))), "cpu", "float32")


def vocabulary_scans(monkeypatch, vocab: int) -> list[int]:
    """Count torch.isin calls over the whole vocabulary (what the suppression processors run)."""
    calls = []
    real = torch.isin

    def spy(elements, test_elements, *args, **kwargs):
        if getattr(elements, "numel", lambda: 0)() == vocab:
            calls.append(1)
        return real(elements, test_elements, *args, **kwargs)

    monkeypatch.setattr(torch, "isin", spy)
    return calls


def test_suppression_masks_are_built_once_per_generate_call_and_change_no_token(engine, tiny_dir, monkeypatch):
    samples, _ = sf.read(clip(tiny_dir), dtype="float32")
    windows = [samples, np.concatenate([samples, samples])]
    options = Options(language="en")
    scans = vocabulary_scans(monkeypatch, engine.model.config.vocab_size)
    cached = engine._whisper(windows, options, FileState("en"), "")
    once = len(scans)
    del engine.model._retrieve_logit_processors  # transformers' own processors again
    scans.clear()
    plain = engine._whisper(windows, options, FileState("en"), "")
    assert cached == plain and sum(len(p) for p in plain) > 0
    assert 1 <= once <= 2 and len(scans) > 10 * once  # one mask per processor, not one per step
