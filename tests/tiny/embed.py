from tests.tiny import TinyCase, no_case
from tests.tiny.bert import build


def case(root, runtime="transformers"):
    if runtime not in ("transformers", "onnxruntime"):
        no_case("embed", runtime)
    return TinyCase(model=str(build(root)), args=["the cat", "a dog", "stock prices"])
