from tests.tiny import TinyCase, no_case
from tests.tiny.sd import build


def case(root, runtime="diffusers"):
    if runtime != "diffusers":
        no_case("image", runtime)
    out = root / "image-out"  # where images go without -o, so the contract test writes no files in cwd
    out.mkdir(exist_ok=True)
    return TinyCase(
        model=str(build(root)), args=["a red fox"], options=["--steps", "2", "--seed", "0", "--out-dir", str(out)]
    )
