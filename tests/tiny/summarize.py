from tests.tiny import TinyCase, no_case
from tests.tiny.generate import build
from tests.tiny.gguf_llama import build as build_gguf


def case(root, runtime="transformers"):
    if runtime not in ("transformers", "llama.cpp"):
        no_case("summarize", runtime)
    model = build(root) if runtime == "transformers" else build_gguf(root)
    return TinyCase(
        model=str(model), args=["The meeting decided to ship the release on Friday."], options=["--max-tokens", "8"]
    )
