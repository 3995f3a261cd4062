"""A language model's vocabulary head (hidden size -> vocabulary) in the layout the CPU reads fastest.

On a CPU in float32, ``F.linear(x, w)`` with the head's weight as stored ([vocabulary, hidden])
is MKL's slow path for one row or a few; ``x @ w_t`` with the weight stored transposed is not.
Measured on 2 AVX2 cores (AMD EPYC, torch 2.13 with MKL), one row: Whisper tiny.en's
51,864 x 384 head 5.9 -> 2.2 ms, SmolLM2's 49,152 x 576 7.3 -> 4.3 ms, a Qwen2.5-0.5B-sized
151,936 x 896 head 30.8 -> 21.2 ms. The other projections of a layer are no faster that way (some
slower), so only the head changes. Used by the transformers runtimes of transcribe (Whisper) and
generate (pipelines/speech/hf_engine.py, pipelines/llm/hf_engine.py).
"""

from __future__ import annotations


def transpose_head(model) -> None:
    """Replace ``model``'s output embeddings by ``x @ w_t`` (+ bias) over a transposed copy of its
    weight. A head tied to the token embedding shares that copy: the embedding then reads it as
    a strided view, so memory still holds one copy."""
    import torch

    class Head(torch.nn.Module):
        def __init__(self, w_t, bias) -> None:
            super().__init__()
            self.w_t, self.bias = w_t, bias

        def forward(self, x):
            y = x @ self.w_t
            return y if self.bias is None else y + self.bias

    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    w_t = head.weight.detach().t().contiguous()
    if embed is not None and embed.weight.data_ptr() == head.weight.data_ptr():
        embed.weight = torch.nn.Parameter(w_t.t(), requires_grad=False)
    model.set_output_embeddings(Head(w_t, head.bias))
