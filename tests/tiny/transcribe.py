from tests.tiny import TinyCase
from tests.tiny.whisper import build, clip


def case(root):
    return TinyCase(model=str(build(root)), args=[str(clip(root))], runtime="transformers")
