from tests.tiny import TinyCase, no_case
from tests.tiny.bert import build


def case(root, runtime="transformers"):
    if runtime not in ("transformers", "onnxruntime"):
        no_case("search", runtime)
    corpus = root / "tiny-corpus"
    corpus.mkdir(exist_ok=True)
    (corpus / "a.md").write_text("the cat sat\n\nthe dog barked\n\nstock prices fell\n")
    return TinyCase(model=str(build(root)), args=["cat"], options=["--corpus", str(corpus), "-k", "2"])
