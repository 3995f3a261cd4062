from tests.tiny import TinyCase, no_case
from tests.tiny.torch_vision import alias, build_mtcnn
from tests.tiny.vision import build_yolos, picture


def case(root, runtime="transformers"):
    image = str(picture(root / "tiny-images"))
    if runtime == "transformers":
        return TinyCase(model=str(build_yolos(root)), args=[image], options=["--threshold", "0"])
    if runtime == "torch":
        return TinyCase(
            model="tiny-mtcnn",
            args=[image],
            runtime="torch",
            aliases=alias("tiny-mtcnn", build_mtcnn(root), "MTCNN", "detect", "face-detection"),
        )
    no_case("detect", runtime)
