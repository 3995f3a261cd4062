from tests.tiny import TinyCase
from tests.tiny.bert import build


def case(root):
    return TinyCase(model=str(build(root)), args=["good movie", "bad movie"], options=["--labels", "good,bad"])
