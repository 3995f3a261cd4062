"""The documentation holds: every link and anchor resolves, every `run …` option shown exists, the
commands marked runnable run, and the README stays a front page.

Checked: README.md, docs/*.md and benchmarks/README.md.
- Links: every relative link names a file or folder of the repository, and every `#anchor` (in the
  same page or another) is a heading of that page under GitHub's slug rules.
- Commands: every `run …` in a fenced `console` block (lines that start with `$ `) or `sh`/`bash`
  block (every line), and in inline code, is walked down the click tree of
  ``taskrun.runner.cli.main`` (groups such as `run logs show` and `run cache prune` included): the
  subcommand must exist and each `--option`/`-x` must be one its `--help` lists. Inline code whose
  subcommand is a placeholder (`run TASK --json`) is skipped; a fenced block must be concrete.
- Runnable: a fenced block right after a `<!-- runnable -->` line has its `run` commands run
  through CliRunner (in a scratch folder that sees samples/) and each must exit 0;
  `<!-- runnable: real -->` marks a block whose commands read the packaged weights (`real` tier).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
README_MAX_BYTES = 20 * 1024
SHELL_LANGS = {"sh", "bash", "shell", "zsh"}
SEPARATORS = {"|", "||", "&&", ";", "&"}
RUNNABLE = re.compile(r"^\s*<!--\s*runnable(?::\s*(real))?\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"\[[^\[\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


# --------------------------------------------------------------------------- markdown


@dataclass
class Block:
    lang: str
    lines: list[str]
    line: int  # 1-based line of the opening fence
    runnable: str | None  # None, "plain" or "real"


def split_markdown(text: str) -> tuple[list[Block], str]:
    """The fenced blocks, and the prose with each block's lines blanked (line numbers kept)."""
    blocks, prose, lines = [], [], text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        indent, fence, lang = m.groups()
        before = next((ln for ln in reversed(prose) if ln.strip()), "")
        marker = RUNNABLE.match(before)
        body, start = [], i
        i += 1
        while i < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[i]):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        blocks.append(Block(lang.lower(), body, start + 1, (marker.group(1) or "plain") if marker else None))
        prose.extend([""] * (len(body) + 2))
        i += 1
    return blocks, "\n".join(prose)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower case, punctuation other than '-' and
    '_' dropped, each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    _, prose = split_markdown(text)
    seen: dict[str, int] = {}
    out = set(HTML_ANCHOR.findall(prose))
    for line in prose.split("\n"):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def link_errors(page: Path, text: str, root: Path = ROOT) -> list[str]:
    """Every relative link of ``text`` (the page at ``page``) that names no file, or an anchor that
    page does not have."""
    _, prose = split_markdown(text)
    prose = CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), prose)  # no links inside inline code
    errors = []
    for target in LINK.findall(prose) + REF_LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: …
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.name}: ({target})"
        if root.resolve() not in (dest, *dest.parents):
            errors.append(f"{where}: leads out of the repository")
        elif not dest.exists():
            errors.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            errors.append(f"{where}: no heading #{anchor} in {dest.name}")
    return errors


# --------------------------------------------------------------------------- commands


@dataclass
class Command:
    where: str
    args: list[str]  # after `run`
    inline: bool = False


def shell_lines(block: Block) -> list[str]:
    """The commands of a console block (lines after `$ `) or shell block (every line), with their
    backslash continuations joined."""
    out, current = [], None
    for line in block.lines:
        if current is not None:
            current += " " + line.strip()
        elif block.lang == "console" and line.startswith("$ "):
            current = line[2:]
        elif block.lang in SHELL_LANGS and line.strip() and not line.lstrip().startswith("#"):
            current = line
        else:
            continue
        if current.endswith("\\"):
            current = current[:-1]
        else:
            out.append(current)
            current = None
    return out + ([current] if current else [])


def run_commands(line: str) -> list[list[str]]:
    """The arguments of each `run …` in one shell line (pipes, `&&`, `;` and env assignments
    understood; quotes as the shell reads them; `# comments` dropped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    segments: list[list[str]] = [[]]
    tokens = iter(lexer)
    for tok in tokens:
        if tok in SEPARATORS:
            segments.append([])
        elif set(tok) <= set("<>&") or tok in {"(", ")"}:  # a redirection: skip its target
            next(tokens, None)
        else:
            segments[-1].append(tok)
    out = []
    for seg in segments:
        while seg and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", seg[0]):
            seg = seg[1:]
        if seg and seg[0] in {"run", "taskrun"}:
            out.append(seg[1:])
    return out


def unlabeled_command_blocks(page: str, text: str) -> list[str]:
    """Blocks that show `run` commands but are not `console` or `sh`, so their commands would go
    unchecked."""
    blocks, _ = split_markdown(text)
    return [
        f"{page}:{b.line}: a block of `run` commands is {b.lang or 'unlabeled'}: make it console or sh"
        for b in blocks
        if b.lang != "console"
        and b.lang not in SHELL_LANGS
        and any(re.match(r"^\s*(\$ )?run ", line) for line in b.lines)
    ]


def fenced_commands(page: str, text: str) -> list[tuple[Block, Command]]:
    blocks, _ = split_markdown(text)
    return [
        (b, Command(f"{page}:{b.line}", args))
        for b in blocks
        if b.lang == "console" or b.lang in SHELL_LANGS
        for line in shell_lines(b)
        for args in run_commands(line)
    ]


def inline_commands(page: str, text: str) -> list[Command]:
    _, prose = split_markdown(text)
    out = []
    for m in CODE_SPAN.finditer(prose):
        code = " ".join(m.group(2).split())
        if code.startswith("run "):
            line = prose.count("\n", 0, m.start()) + 1
            try:
                found = run_commands(code)
            except ValueError:  # unbalanced quotes: prose, not a command
                continue
            out += [Command(f"{page}:{line}", args, inline=True) for args in found]
    return out


def is_placeholder(token: str) -> bool:
    return token in {"…", "..."} or bool(re.fullmatch(r"[A-Z][A-Z_]*…?", token))


def options_of(cmd: click.Command) -> dict[str, click.Option]:
    """What `--help` lists for ``cmd``: its visible options, and the help option itself."""
    ctx = click.Context(cmd, info_name=cmd.name)
    out = {
        name: p
        for p in cmd.params
        if isinstance(p, click.Option) and not p.hidden
        for name in p.opts + p.secondary_opts
    }
    help_option = cmd.get_help_option(ctx)
    return out | ({name: help_option for name in help_option.opts} if help_option else {})


def takes_value(opt: click.Option) -> bool:
    return not (opt.is_flag or opt.count)


def is_option(token: str) -> bool:
    return token.startswith("-") and token != "-" and not re.match(r"^-\d", token)


def check_command(args: list[str], root: click.Group = main) -> tuple[list[str], list[str], list[str]]:
    """Walk ``run ARGS`` down the click tree: (the command path, the options checked, the errors).
    A placeholder where a subcommand should be gives the path so far and no errors (inline code)."""
    cmd, path, checked, errors = root, ["run"], [], []
    tokens = list(args)
    while tokens:
        tok = tokens.pop(0)
        if tok == "--":
            break
        opts = options_of(cmd)
        if is_option(tok):
            name = tok.split("=", 1)[0]
            if name not in opts:
                errors.append(f"`{' '.join(path)}` has no option {name} (see `{' '.join(path)} --help`)")
            else:
                checked.append(name)
                if takes_value(opts[name]) and "=" not in tok and tokens:
                    tokens.pop(0)
        elif isinstance(cmd, click.Group):
            sub = cmd.get_command(click.Context(cmd), tok)
            if sub is None:
                if is_placeholder(tok):
                    return path + [tok], checked, errors
                errors.append(f"`{' '.join(path)}` has no subcommand {tok!r}")
                break
            cmd = sub
            path.append(tok)
    return path, checked, errors


def command_errors(commands: list[Command]) -> list[str]:
    out = []
    for c in commands:
        path, _, errors = check_command(c.args)
        if c.inline and is_placeholder(path[-1]):
            continue
        if not c.inline and is_placeholder(path[-1]):
            errors = errors + [f"a placeholder {path[-1]!r} where a subcommand goes: show a real command"]
        out += [f"{c.where}: run {' '.join(c.args)}: {e}" for e in errors]
    return out


def all_commands() -> list[Command]:
    out = []
    for page in PAGES:
        name, text = str(page.relative_to(ROOT)), page.read_text()
        out += [c for _, c in fenced_commands(name, text)] + inline_commands(name, text)
    return out


def runnable() -> list:
    params = []
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        for block, cmd in fenced_commands(name, page.read_text()):
            if block.runnable:
                marks = [pytest.mark.real] if block.runnable == "real" else []
                params.append(pytest.param(cmd.args, marks=marks, id=f"{cmd.where} run {' '.join(cmd.args)}"))
    return params


# --------------------------------------------------------------------------- the docs as they are


def test_every_link_and_anchor_resolves():
    errors = [e for page in PAGES for e in link_errors(page, page.read_text())]
    assert errors == []


def test_every_documented_command_and_option_exists():
    commands = all_commands()
    assert len(commands) > 100  # the parser finds the documented commands at all
    assert command_errors(commands) == []
    assert [e for p in PAGES for e in unlabeled_command_blocks(p.name, p.read_text())] == []


def test_the_checked_options_are_what_help_prints():
    """The option sets the walk uses are what `run … --help` shows (a few commands, groups too)."""
    for args in (["transcribe"], ["logs"], ["cache", "prune"], ["batch"], []):
        cmd = main
        for a in args:
            cmd = cmd.get_command(click.Context(cmd), a)
        shown = CliRunner().invoke(main, [*args, "--help"])
        assert shown.exit_code == 0, shown.output
        for name in options_of(cmd):
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", shown.output), (args, name)


@pytest.mark.parametrize("args", runnable())
def test_runnable_commands_run(args, tmp_path, monkeypatch):
    (tmp_path / "samples").symlink_to(ROOT / "samples")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, f"run {' '.join(args)} exited {r.exit_code}:\n{r.output}\n{r.exception!r}"


def test_some_commands_are_marked_runnable():
    assert len(runnable()) >= 4


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= README_MAX_BYTES, f"README.md is {len(readme.encode())} bytes"
    two = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"^make demo\b", two, re.M) and re.search(r"^make test\b", two, re.M)
    for page in sorted((ROOT / "docs").glob("*.md")):  # every docs page is reachable from it
        assert f"](docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"


# --------------------------------------------------------------------------- the checks, on made-up pages


BAD_PAGE = """# A page

## Where `-o` may write

See [the top](#a-page), [here](#where--o-may-write), [gone](#no-such-heading), [a file](missing.md)
and [a heading elsewhere](other.md#nope); `[not a link](nowhere.md)` is code.

```console
$ run transcribe talk.wav --langauge de -o talk.srt
$ printf 'hi\\n' | \\
    run chat --max-tokens 5 --sytem "Be brief."
$ run logs show 20261130-abc --log-db x.db
$ run cache prune --older-then 30
$ run frobnicate x
$ run TASK --json
```

```sh
HF_HUB_OFFLINE=1 run embed -f texts.txt -k 3   # embed has no -k
```

```
$ run tasks
```

Inline: `run search "q" --corpus d -k 2`, `run TASK --json` (a placeholder: skipped), `run fit MODEL --contxt 8`.
"""


def test_the_checks_catch_a_misspelled_option_a_bad_link_and_an_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(BAD_PAGE)
    (tmp_path / "other.md").write_text("# Other\n")
    assert link_errors(page, BAD_PAGE, root=tmp_path) == [
        "page.md: (#no-such-heading): no heading #no-such-heading in page.md",
        "page.md: (missing.md): no such file",
        "page.md: (other.md#nope): no heading #nope in other.md",
    ]
    commands = [c for _, c in fenced_commands("page.md", BAD_PAGE)] + inline_commands("page.md", BAD_PAGE)
    errors = command_errors(commands)
    assert [e.split(": ", 2)[2] for e in errors] == [
        "`run transcribe` has no option --langauge (see `run transcribe --help`)",
        "`run chat` has no option --sytem (see `run chat --help`)",
        "`run cache prune` has no option --older-then (see `run cache prune --help`)",
        "`run` has no subcommand 'frobnicate'",
        "a placeholder 'TASK' where a subcommand goes: show a real command",
        "`run embed` has no option -k (see `run embed --help`)",
        "`run fit` has no option --contxt (see `run fit --help`)",
    ]
    assert unlabeled_command_blocks("page.md", BAD_PAGE) == [
        "page.md:22: a block of `run` commands is unlabeled: make it console or sh"
    ]
    assert check_command(["logs", "show", "20261130-abc", "--log-db", "x.db"]) == (
        ["run", "logs", "show"],
        ["--log-db"],
        [],
    )


def test_slugs_follow_github():
    assert slug("Where `-o` may write") == "where--o-may-write"
    assert slug("Batch: `run batch`") == "batch-run-batch"
    assert slug("Language models: GGUF on llama.cpp") == "language-models-gguf-on-llamacpp"
    assert (
        slug("Transcribe: greedy by measured WER, the file's speech in one stretch")
        == "transcribe-greedy-by-measured-wer-the-files-speech-in-one-stretch"
    )
    assert anchors("# A\n## B\n## B\n```\n# not a heading\n```\n") == {"a", "b", "b-1"}
