from tests.tiny import TinyCase, no_case
from tests.tiny.bert import build
from tests.tiny.torch_vision import alias, build_efficientnet
from tests.tiny.vision import picture


def case(root, runtime="transformers"):
    if runtime == "transformers":
        return TinyCase(model=str(build(root)), args=["good movie", "bad movie"], options=["--labels", "good,bad"])
    if runtime in ("torch", "onnxruntime"):
        aliases = alias(
            "tiny-efficientnet", build_efficientnet(root), "EfficientNetLite0", "classify", "image-classification"
        )
        aliases["tiny-efficientnet"]["runtimes"] = ["onnxruntime", "torch"]
        return TinyCase(
            model="tiny-efficientnet",
            args=[str(picture(root / "tiny-images"))],
            options=["-k", "3"],
            runtime=runtime,
            aliases=aliases,
        )
    no_case("classify", runtime)
