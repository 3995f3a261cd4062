from tests.tiny import TinyCase
from tests.tiny.generate import build


def case(root):
    return TinyCase(model=str(build(root)), args=["The meeting decided to ship the release on Friday."],
                    options=["--max-tokens", "8"])
