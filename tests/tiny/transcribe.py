from tests.tiny import TinyCase, no_case
from tests.tiny.whisper import build, build_ct2, clip


def case(root, runtime="transformers"):
    builders = {"transformers": build, "ctranslate2": build_ct2}
    if runtime not in builders:
        no_case("transcribe", runtime)
    return TinyCase(model=str(builders[runtime](root)), args=[str(clip(root))], runtime=runtime)
