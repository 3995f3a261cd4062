from tests.tiny import TinyCase
from tests.tiny.vision import build_yolos, picture


def case(root):
    return TinyCase(model=str(build_yolos(root)), args=[str(picture(root / "tiny-images"))],
                    options=["--threshold", "0"])
