"""classify: a text or an image → labels with scores, best first."""

from __future__ import annotations

from dataclasses import dataclass, field

from taskrun.tasks.base import Input, ModelCard, Task, TaskError, check_model_serves, metric, option, require

TEXT_KINDS = {"sentence-embedding", "text-classification"}


@dataclass(frozen=True)
class Options:
    labels: tuple[str, ...] = option(
        (),
        "--labels",
        multiple=True,
        metavar="A,B,C",
        help="Candidate labels for zero-shot text classification (comma-separated or repeated).",
    )
    template: str = option(
        "This text is about {}.", "--template", help="How each label is phrased before it is embedded (zero-shot)."
    )
    top_k: int = option(5, "-k", "--top-k", help="How many labels to show per input.")
    batch_size: int = option(16, "--batch-size", help="Inputs per forward pass.")

    def __post_init__(self):
        labels = tuple(x.strip() for part in self.labels for x in part.split(",") if x.strip())
        object.__setattr__(self, "labels", labels)
        require(self.top_k > 0, f"--top-k must be at least 1 (got {self.top_k})")
        require(self.batch_size > 0, f"--batch-size must be at least 1 (got {self.batch_size})")
        require(_one_slot(self.template), TEMPLATE_RULE + f" (got {self.template[:60]!r})")
        require(len(set(labels)) == len(labels), "--labels has a label twice")


TEMPLATE_RULE = (
    "--template must hold {} exactly once where the label goes, with nothing inside the braces "
    "(write {{ and }} for a literal brace), in at most 1,000 characters"
)


def _one_slot(template: str) -> bool:
    """Exactly one bare ``{}``: a width, format spec, index or attribute (``{:>20000000}``,
    ``{0}``, ``{.x}``) would let a request make format() build huge strings or read fields."""
    import string

    if len(template) > 1000:
        return False
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(template) if name is not None]
    except ValueError:  # a lone { or }
        return False
    return fields == [("", "", None)]


@dataclass
class Label:
    label: str
    score: float


@dataclass
class Result:
    input: str
    labels: list[Label] = field(default_factory=list)  # best first
    zero_shot: bool = False  # scores are softmaxed similarities to the label texts, not a trained head

    def summary(self) -> str:
        return f"{self.labels[0].label} {self.labels[0].score:.3f}" if self.labels else "-"


@dataclass
class Metrics:
    items: int = metric("inputs classified", 0)
    items_per_s: float = metric("items ÷ time in preprocess + forward + postprocess (load excluded)")
    latency_s: float = metric("mean time per item, i.e. batch time ÷ items in it")


class ClassifyTask(Task):
    def check(self, inputs: list[Input], options: Options, card: ModelCard) -> None:
        check_model_serves(self, card)
        text_model = card.kind in TEXT_KINDS
        for inp in inputs:
            self.check_input(inp)
            if inp.kind == "text" and not text_model:
                raise TaskError(
                    f"{inp.describe()} is text, but `{card.name}` is {card.kind or 'an image'} "
                    f"model; leave out --model to use the default text classifier, or pick "
                    f"a text model (minilm, or any *ForSequenceClassification)"
                )
            if inp.kind == "image" and text_model:
                raise TaskError(
                    f"{inp.describe()} is an image, but `{card.name}` is a text model; "
                    f"leave out --model to use the default image classifier"
                )
        if text_model and card.kind == "sentence-embedding" and len(options.labels) < 2:
            raise TaskError(
                f"zero-shot classification with `{card.name}` needs at least two labels: --labels positive,negative"
            )

    def check_input(self, inp: Input) -> None:
        super().check_input(inp)
        if inp.kind == "image" and inp.path:
            from taskrun.tasks.image_files import probe_image

            probe_image(inp.path)  # a non-image or a decompression bomb is refused before weights load

    def render(self, result: Result, options) -> str:
        lines = [f"{result.input}"]
        for lab in result.labels[: options.top_k if options else 5]:
            lines.append(f"  {lab.score:6.3f}  {lab.label}")
        return "\n".join(lines)


TASK = ClassifyTask(
    name="classify",
    summary="Label texts (zero-shot with --labels, or a trained text classifier) or images.",
    takes="texts (arguments, -f file, stdin) with --labels, or image files/folders",
    returns="per input, labels with scores, best first (--top-k)",
    Options=Options,
    Result=Result,
    Metrics=Metrics,
    input_kinds=("text", "image"),
    model_kinds="a text classifier or sentence-embedding model (text), or an image classifier (images)",
)
