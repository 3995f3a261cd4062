from tests.tiny import TinyCase, no_case
from tests.tiny.generate import build


def case(root, runtime="transformers"):
    if runtime != "transformers":
        no_case("summarize", runtime)
    return TinyCase(model=str(build(root)), args=["The meeting decided to ship the release on Friday."],
                    options=["--max-tokens", "8"])
