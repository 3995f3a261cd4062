from tests.tiny import TinyCase
from tests.tiny.bert import build


def case(root):
    return TinyCase(model=str(build(root)), args=["the cat", "a dog", "stock prices"])
