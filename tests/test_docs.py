"""Every command the docs show runs as they say, and every file they name exists.

The commands are collected from each fenced block labelled ``bash``, ``sh``, ``shell`` or
``console`` in README.md and docs/*.md (a block with no label is output, not commands):

- ``\\`` continuations are joined; ``&&``, ``||``, ``;`` and ``|`` separate commands; a
  ``# ...`` comment ends one; ``VAR=value`` before a command is its environment.
- In a ``console`` block only the lines after a ``$ `` prompt are commands; the lines after
  one are its output. A ``$ cat FILE`` writes what its output shows into FILE, for the
  commands after it; an output line that starts with ``tfgpu: `` or ``Fix: `` must be in
  what the command prints.
- A command must exit 0, unless the docs say otherwise: ``<!-- exit: N -->`` on the line
  before the block's opening fence (every command of the block), or a trailing ``# exit N``
  comment (that command).

Each command is classified by :func:`classify` (an unclassified one fails
``test_every_documented_command_is_classified``):

- ``run``: run here, in a copy of the repository (the files git knows, untracked ones too)
  beside a ``shared/data`` that is ``TFGPU_DATA_DIR``, so ``export TFGPU_DATA_DIR=../shared/data``
  holds as the README writes it; all of them once, in the docs' order, in ``docs_run``.
- ``plan``: a training ``tfgpu run``: checked as ``tfgpu plan`` with the same recipe and settings
  (the config, names and local data, without TensorFlow); ``tests/training/test_e2e.py`` and
  ``tests/data/test_data_e2e.py`` train the recipes. A recipe that reads ``examples/`` is planned
  after ``recipes/make_examples.py`` has written it (slow).
- ``slow``: run for real (``tfgpu launch`` of the shipped scripts, ``make_examples.py``).
- ``skip``: not run here, with the reason (installs, the test suite, benchmarks, containers,
  clusters, placeholders).

The files: every relative link (and its ``#anchor``), every path a command names, every
``recipes/``, ``docs/``, ``benchmarks/``, ``tests/``, ``containers/`` or ``tfgpu/`` path in the
text, and every path in the examples of ``tfgpu --help`` and its commands' help must exist.
"""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import click
import pytest
import yaml

from .conftest import ROOT, child_env, data_dir

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = ("bash", "sh", "shell", "console")
SEPARATORS = ("&&", "||", ";", "|", "&")
PATH_WORD = re.compile(r"[\w.-]+(/[\w.-]+)*\.(yaml|yml|py|md|sh|conf|json|sbatch|npz)")
REPO_PATH = re.compile(r"(?<![\w/.$-])(?:recipes|docs|benchmarks|tests|containers|tfgpu)/[\w./-]*[\w-]\.(?:py|yaml|yml|md|sh|conf)\b")
PLACEHOLDERS = {
    "my.yaml": "the user's own recipe, mounted into the container",
}
HISTORICAL: dict[str, str] = {}  # a path the docs name as history, not as a file of today: why
RUN, PLAN, SLOW, SKIP = "run", "plan", "slow", "skip"
CHEAP_TIMEOUT = 120


# --------------------------------------------------------------------------- collecting


@dataclasses.dataclass(frozen=True)
class Command:
    doc: str                    # README.md, docs/x.md
    line: int                   # 1-based line of the command's first line
    text: str                   # as written (continuations joined), without its trailing comment
    words: tuple[str, ...]      # the command's words, without the leading VAR=value
    env: tuple[tuple[str, str], ...] = ()
    stdout_to: Optional[str] = None     # > FILE
    exit: int = 0
    output: str = ""            # console blocks: what the docs show it prints

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def shell_blocks(path: Path) -> list[tuple[int, str, list[str], Optional[int]]]:
    """(line of the first content line, language, content lines, the exit code the comment before it gives)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = re.match(r"\s*```\s*(\w*)", lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), len(lines))
        if opening.group(1) in SHELL_LANGS:
            marker = re.fullmatch(r"\s*<!--\s*exit:\s*(\d+)\s*-->\s*", lines[i - 1]) if i else None
            blocks.append((i + 2, opening.group(1), lines[i + 1:end], int(marker.group(1)) if marker else None))
        i = end + 1
    return blocks


def _words(text: str) -> list[list[str]]:
    """The simple commands of one shell line, split at ``&&``, ``||``, ``;``, ``|``; comments dropped."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    for token in lexer:
        if token in SEPARATORS:
            out.append([])
        else:
            out[-1].append(token)
    return [w for w in out if w]


def _commands_of_line(doc: str, line: int, text: str, default_exit: Optional[int], output: str) -> list[Command]:
    trailing = re.search(r"\s#\s*exit\s+(\d+)\b[^'\"]*$", text)
    code = int(trailing.group(1)) if trailing else (default_exit or 0)
    shown = re.sub(r"\s+#(?![^'\"]*['\"]).*$", "", text).strip()
    found = []
    for words in _words(text):
        env = []
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
            env.append(tuple(words.pop(0).split("=", 1)))
        stdout_to = None
        if ">" in words and words.index(">") + 1 < len(words):
            at = words.index(">")
            stdout_to = words[at + 1]
            words = words[:at] + words[at + 2:]
        if words:
            found.append(Command(doc, line, shown, tuple(words), tuple(env), stdout_to, code, output))
    return found


def doc_commands(path: Path) -> list[Command]:
    doc = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    found: list[Command] = []
    for first, lang, lines, default_exit in shell_blocks(path):
        i = 0
        while i < len(lines):
            start, text = i, lines[i]
            if lang == "console":
                if not text.startswith("$ "):
                    i += 1
                    continue
                text = text[2:]
            while text.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text.rstrip()[:-1] + " " + lines[i].strip()
            output = []
            if lang == "console":
                while i + 1 < len(lines) and not lines[i + 1].startswith("$ "):
                    i += 1
                    output.append(lines[i])
            if text.strip() and not text.lstrip().startswith("#"):
                found += _commands_of_line(doc, first + start, text.strip(), default_exit, "\n".join(output))
            i += 1
    return found


def all_commands() -> list[Command]:
    return [c for path in DOCS for c in doc_commands(path)]


def help_examples() -> list[Command]:
    """The ``tfgpu ...`` example lines of ``tfgpu --help`` and of each command's help (descriptions after 2+ spaces
    dropped, ``\\`` continuations joined)."""
    from tfgpu.cli import main  # noqa: PLC0415 - no TensorFlow

    found = []
    ctx = click.Context(main)
    commands = {n: main.get_command(ctx, n) for n in main.list_commands(ctx)}
    for name, text in [("tfgpu", main.help or "")] + [(f"tfgpu {n}", c.help or "") for n, c in commands.items()]:
        lines = text.splitlines()
        for i, line in enumerate(lines):
            example = line.strip()
            if not example.startswith("tfgpu "):
                continue
            while example.endswith("\\") and i + 1 < len(lines):
                i += 1
                example = example[:-1] + " " + lines[i].strip()
            example = re.split(r"\s{2,}", example)[0]
            found += [Command(f"{name} --help", i + 1, example, tuple(words)) for words in _words(example)]
    return found


# --------------------------------------------------------------------------- classifying


def program(word: str) -> str:
    """``.venv/bin/tfgpu`` -> ``tfgpu``, ``python3`` -> ``python``."""
    name = word.rsplit("/", 1)[-1]
    return "python" if re.fullmatch(r"python(3(\.\d+)?)?", name) else name


def recipe_reads_examples(recipe: str) -> bool:
    """Whether the recipe's data (path, data_dir, test_path, ...) lies under examples/, which make_examples writes."""
    try:
        data = (yaml.safe_load((ROOT / recipe).read_text()) or {}).get("data") or {}
    except (OSError, yaml.YAMLError):
        return False
    return any(isinstance(v, str) and v.startswith("examples/") for v in data.values())


def classify(c: Command) -> Optional[tuple[str, str]]:
    """(what this test does with the command, why); None: unclassified, which fails."""
    w = c.words
    prog = program(w[0])
    if prog == "export":
        return RUN, "sets the variable for the page's later commands"
    if prog == "mkdir":
        return RUN, "creates folders"
    if prog == "cat" and c.output:
        return RUN, "writes the file its output shows"
    if prog == "tfgpu":
        sub = w[1] if len(w) > 1 else ""
        if "--help" in w or "-h" in w or sub in ("", "--version"):
            return RUN, "help"
        if sub == "export" and len(w) > 2 and w[2] in ("savedmodel", "onnx", "litert"):
            return SKIP, ("needs the run directory of a finished training run (tests/serving/test_export.py trains runs "
                          "and exports them in every format)")
        if sub in ("plan", "export"):
            return RUN, "no TensorFlow: well under a second"
        if sub in ("devices", "doctor"):
            return RUN, "reads NVML (and starts TensorFlow unless --no-tensorflow): seconds"
        if sub == "run" and "--dry-run" in w:
            return RUN, "checks without training"
        if sub == "run" and "--fast-dev-run" in w:
            return PLAN, ("trains a step: checked as `tfgpu plan` with the same recipe and settings "
                          "(tests/training/test_gradients.py runs it)")
        if sub == "lr-find":
            return SKIP, ("trains 100 steps (tests/training/test_gradients.py runs the range test and trains with its "
                          "suggestion)")
        if sub == "find-batch-size":
            return SKIP, ("tries batch sizes in child processes, a minute or more (tests/training/test_gradients.py "
                          "runs it with the out-of-memory seam and for real)")
        if sub == "run" and "--resume" in w:
            return SKIP, ("continues the run directory of an earlier, killed run (tests/training/test_faults.py and "
                          "tests/training/test_state.py kill runs and resume them)")
        if sub == "run" and any(x.startswith("model.init_from=") for x in w):
            return SKIP, ("starts from the run directory of an earlier training run (tests/model/test_transfer.py trains "
                          "one and starts from it)")
        if sub == "run":
            recipe = next((a for a in w[2:] if a.endswith((".yaml", ".yml"))), "")
            if recipe_reads_examples(recipe):
                return SLOW, "trains: checked as `tfgpu plan` after recipes/make_examples.py wrote examples/ (about 20 s)"
            return PLAN, "trains (minutes): checked as `tfgpu plan` with the same recipe and settings"
        if sub == "sweep" and "--resume" in w:
            return SKIP, ("continues the sweep directory of an earlier, stopped sweep (tests/experiments/test_sweep.py stops and "
                          "kills sweeps and resumes them)")
        if sub == "sweep":
            return PLAN, ("trains many runs (minutes): checked as `tfgpu plan` with the same recipe, settings and "
                          "--parallel (the sweep's parameters and slots); tests/experiments/test_sweep.py runs sweeps")
        if sub in ("runs", "compare"):
            return SKIP, ("needs the run directories of finished training runs (tests/experiments/test_compare.py trains runs, "
                          "lists and compares them)")
        if sub == "evaluate":
            return SKIP, "needs the run directory of a finished training run (tests/data/test_data_e2e.py evaluates one)"
        if sub == "predict":
            return SKIP, "needs the run directory of a finished training run (tests/serving/test_predict.py trains and predicts)"
        if sub == "launch":
            return SLOW, "trains: runs the script for real (tests/launch/test_examples.py checks its accuracy)"
        if sub == "bench":
            return SKIP, "times this machine's hardware (tests/devices/test_bench.py)"
        return None
    if prog == "python":
        if w[1:3] == ("-m", "pytest"):
            return SKIP, "the test suite itself"
        if w[1:3] == ("-m", "venv"):
            return SKIP, "creates the virtual environment (.ci/run runs this line verbatim)"
        if w[1:2] == ("recipes/make_examples.py",):
            return SLOW, "writes examples/ (about 20 s)"
        if len(w) > 1 and w[1].startswith("benchmarks/"):
            return SKIP, "a benchmark: 15-25 minutes on 2 cores (tests/devices/test_bench.py runs the harnesses small)"
        return None
    if prog == "pip":
        return SKIP, "installs packages (.ci/run installs the test extra, which includes jax and tfds)"
    if prog in ("docker", "podman") or (prog == "sudo" and {"containers/build_cpu_image.sh",
                                                               "containers/build_gpu_image.sh"} & set(w)):
        return SKIP, ("needs a container engine (tests/containers/test_docker.py checks the docker run lines, "
                      "tests/containers/test_container.py builds and runs the CPU and GPU images with podman)")
    if prog in ("sbatch", "kubectl"):
        return SKIP, ("needs a Slurm or Kubernetes cluster (tests/cluster/test_slurm.py runs the exported job with "
                      "sbatch on a local Slurm cluster; tests/cluster/test_cluster.py checks the exported files)")
    if prog == "sudo" and {"containers/slurm/start.sh", "containers/slurm/stop.sh"} & set(w):
        return SKIP, ("starts or stops the local Slurm cluster as root (tests/cluster/test_slurm.py starts one, runs "
                      "the exported job on it and stops it)")
    if prog == "sudo" and w[1:3] == ("apt-get", "install"):
        return SKIP, "installs system packages (.ci/run installs them)"
    if prog == "kill":
        return SKIP, "an illustration: <pid> stands for a process id"
    return None


def as_plan(words: tuple[str, ...]) -> list[str]:
    """``tfgpu run RECIPE ...`` (or ``tfgpu sweep RECIPE ...``) as the ``tfgpu plan`` with the same recipe and
    settings (run-only and sweep-only options dropped; ``--parallel K`` is ``tfgpu plan``'s too)."""
    out, rest = ["tfgpu", "plan"], list(words[2:])
    dropped = ("--max-restarts", "--output-dir", "--trials", "--storage", "--study", "--keep")  # run-/sweep-only
    while rest:
        word = rest.pop(0)
        if word == "--fast-dev-run":  # a run-only flag
            continue
        if word in dropped:
            rest.pop(0)
        elif not word.startswith(tuple(f"{d}=" for d in dropped)):
            out.append(word)
    return out


# --------------------------------------------------------------------------- running


@dataclasses.dataclass
class Result:
    argv: list[str]
    returncode: int
    output: str
    #: CPU seconds (user and system) of the command and its children: unlike wall time, not stretched by the
    #: other xdist worker or the disk
    cpu_seconds: float


class Session:
    """A copy of the repository, beside ``shared/data``, where the documented commands run."""

    def __init__(self, base: Path) -> None:
        self.root = base / "repo"
        (base / "shared").mkdir(parents=True)
        (base / "shared" / "data").symlink_to(data_dir())
        for name in tracked_files():
            source = ROOT / name
            if source.is_file():
                (self.root / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, self.root / name)
        self.env: dict[str, dict[str, str]] = {}
        self.results: dict[Command, Result] = {}

    def page_env(self, c: Command) -> dict[str, str]:
        return self.env.setdefault(c.doc, child_env())

    def run(self, c: Command, words: Optional[list[str]] = None, timeout: int = CHEAP_TIMEOUT,
            cheap: bool = True) -> Result:
        """Run ``c`` in the copy; a cheap command's result is recorded for :func:`test_the_cheap_commands_are_fast`."""
        words = list(words or c.words)
        env = self.page_env(c)
        prog = program(words[0])
        if prog == "export":
            for assignment in words[1:]:
                name, _, value = assignment.partition("=")
                env[name] = os.path.expandvars(value.replace("$PWD", str(self.root)))
            return Result(words, 0, "", 0.0)
        if prog == "cat" and c.output:
            (self.root / words[1]).write_text(c.output + "\n")
            return Result(words, 0, "", 0.0)
        if prog == "tfgpu":
            argv = [sys.executable, "-m", "tfgpu.cli", *words[1:]]
        elif prog == "python":
            argv = [sys.executable, *words[1:]]
        else:
            argv = words
        full_env = {**env, **dict(c.env)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(argv, cwd=self.root, env=full_env, capture_output=True, text=True, timeout=timeout)
        if c.stdout_to:
            (self.root / c.stdout_to).write_text(out.stdout)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        result = Result(argv, out.returncode, out.stdout + out.stderr, cpu)
        if cheap:
            self.results[c] = result
        return result


def tracked_files() -> list[str]:
    """The repository's files as a clean clone has them (with the untracked ones git does not ignore)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                                text=True, check=True, timeout=60).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        listed = []
    if listed:
        return listed
    skip = {".git", ".venv", "runs", "examples", "tfgpu-logs", "__pycache__", ".pytest_cache", ".hypothesis"}
    return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(ROOT).parts) and ".egg-info" not in str(p)]


@pytest.fixture(scope="session")
def docs_run(tmp_path_factory) -> Session:
    """Every cheap documented command, run once in the docs' order (a page's exports and files carry on)."""
    session = Session(tmp_path_factory.mktemp("docs"))
    for c in all_commands():
        kind = (classify(c) or (None,))[0]
        if kind == RUN:
            session.run(c)
        elif kind == PLAN:
            session.run(c, as_plan(c.words))
    return session


@pytest.fixture(scope="session")
def examples_written(docs_run: Session) -> Result:
    """``recipes/make_examples.py`` run once in the session's copy."""
    c = Command("recipes/make_examples.py", 1, "python recipes/make_examples.py", ("python", "recipes/make_examples.py"))
    return docs_run.run(c, timeout=600, cheap=False)  # writes every example data set: 36 CPU s, not a cheap command


def _param(c: Command):
    kind, reason = classify(c) or ("unclassified", "")
    marks = []
    if kind == SKIP:
        marks = [pytest.mark.skip(reason=f"{c.where}: {reason}")]
    elif kind == SLOW:
        marks = [pytest.mark.slow]
    return pytest.param(c, kind, marks=marks, id=f"{c.where} {' '.join(c.words)[:70]}")


def _report(c: Command, result: Result) -> str:
    return (f"{c}\n  ran `{' '.join(result.argv)}` in the repository's copy: exit {result.returncode}, "
            f"the docs say {c.exit}\n{result.output[-3000:]}")


@pytest.mark.parametrize(("command", "kind"), [_param(c) for c in all_commands()])
def test_documented_command(command: Command, kind: str, request):
    if kind == "unclassified":
        pytest.fail(f"{command}\n  unclassified: add a rule to classify() in tests/test_docs.py")
    session: Session = request.getfixturevalue("docs_run")
    if kind in (RUN, PLAN):
        result = session.results.get(command) or Result([], 0, "", 0.0)  # exports and cat record no process
    elif program(command.words[0]) == "python":                           # make_examples.py
        result = request.getfixturevalue("examples_written")
    elif command.words[1] == "run":
        request.getfixturevalue("examples_written")
        result = session.run(command, as_plan(command.words))
    else:                                                                 # tfgpu launch
        result = session.run(command, timeout=600, cheap=False)
    assert result.returncode == command.exit, _report(command, result)
    printed = " ".join(result.output.split())
    for line in command.output.splitlines():
        if line.startswith(("tfgpu: ", "Fix: ")):
            assert " ".join(line.split()) in printed, f"{command}\n  the docs show the line\n    {line}\n  which it " \
                f"does not print:\n{result.output[-3000:]}"


def test_every_documented_command_is_classified():
    commands = all_commands()
    assert len(commands) > 50 and {c.doc for c in commands} >= {"README.md", "docs/multiworker.md"}
    unclassified = [str(c) for c in commands if classify(c) is None]
    assert not unclassified, "add a rule to classify() for:\n" + "\n".join(unclassified)
    reasons = {classify(c)[1] for c in commands}
    named = {m.group(0) for r in reasons for m in REPO_PATH.finditer(r)}
    assert named and all((ROOT / p).is_file() for p in named), sorted(named)  # the tests a reason points to exist


def test_the_cheap_commands_are_fast(docs_run: Session):
    """The cheap pass stays cheap: no documented command that runs here takes a training's time (CPU time: a
    start of TensorFlow is about 6 s of it, a training minutes)."""
    slow = [f"{c}: {r.cpu_seconds:.1f} CPU s" for c, r in docs_run.results.items() if r.cpu_seconds > 30]
    assert not slow, "\n".join(slow)


def test_the_collector_reads_what_the_conventions_say(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "```bash", "export A=1          # a comment", ".venv/bin/tfgpu plan x.yaml \\", "    --set a=1 && tfgpu devices",
        "XLA_FLAGS= tfgpu doctor > out.json   # exit 9", "```", "<!-- exit: 3 -->", "```console",
        "$ tfgpu plan bad.yaml", "tfgpu: configuration error: it is bad", "Fix: mend it", "```", "```",
        "tfgpu run not-a-command.yaml", "```"]))
    got = [(c.line, c.words, c.env, c.stdout_to, c.exit, c.output) for c in doc_commands(page)]
    assert got == [
        (2, ("export", "A=1"), (), None, 0, ""),
        (3, (".venv/bin/tfgpu", "plan", "x.yaml", "--set", "a=1"), (), None, 0, ""),
        (3, ("tfgpu", "devices"), (), None, 0, ""),
        (5, ("tfgpu", "doctor"), (("XLA_FLAGS", ""),), "out.json", 9, ""),
        (9, ("tfgpu", "plan", "bad.yaml"), (), None, 3, "tfgpu: configuration error: it is bad\nFix: mend it"),
    ]
    assert classify(doc_commands(page)[2]) == (RUN, "reads NVML (and starts TensorFlow unless --no-tensorflow): "
                                                    "seconds")
    assert classify(Command("x", 1, "frobnicate", ("frobnicate",))) is None
    assert as_plan(("tfgpu", "run", "r.yaml", "--workers", "2", "--max-restarts", "3", "--set", "a=1")) == \
        ["tfgpu", "plan", "r.yaml", "--workers", "2", "--set", "a=1"]


# --------------------------------------------------------------------------- the tfgpu options


def _click_command(words: tuple[str, ...]):
    from tfgpu.cli import main  # noqa: PLC0415 - no TensorFlow

    command, rest = main, list(words[1:])
    while rest and isinstance(command, click.Group) and rest[0] in command.list_commands(click.Context(command)):
        command = command.get_command(click.Context(command), rest.pop(0))
    return command, rest


@pytest.mark.parametrize("command", [c for c in all_commands() + help_examples() if program(c.words[0]) == "tfgpu"],
                         ids=str)
def test_every_documented_tfgpu_option_exists(command: Command):
    """Also for the commands not run here (run --resume, evaluate, launch): each subcommand and --option exists."""
    import click  # noqa: PLC0415

    cmd, rest = _click_command(command.words)
    assert not hasattr(cmd, "commands") or not rest or rest[0].startswith("-") or "|" in rest[0], (
        f"{command}\n  `{rest[0]}` is not a command of `tfgpu {' '.join(command.words[1:-len(rest)])}`")
    known = {o for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}
    known |= {"--help", "-h"}
    if cmd.name == "launch":
        rest = rest[:rest.index("--")] if "--" in rest else rest
    unknown = [w.split("=")[0] for w in rest if w.startswith("-") and w != "--" and w.split("=")[0] not in known]
    assert not unknown, f"{command}\n  tfgpu {cmd.name} has no option {unknown}; it has {sorted(known)}"


# --------------------------------------------------------------------------- the files the docs name


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens (an underscore inside a
    word, as in ``build_gpu_image.sh``, is kept; one that marks emphasis is not)."""
    text = re.sub(r"[`*]|(?<!\w)_|_(?!\w)|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            base = slug(line.lstrip("#"))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    bad = []
    for match in re.finditer(r"\[[^\]]*\]\(([^)\s]+)\)", text):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}: ({target})"
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{where}: {file} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{where}: {dest.relative_to(ROOT)} has no heading #{anchor}")
    return bad


def test_every_link_in_the_docs_leads_somewhere():
    bad = [b for path in DOCS for b in broken_links(path)]
    assert not bad, "\n".join(bad)


def _created(c: Command) -> list[str]:
    """Files a command writes, which later commands of the page may name."""
    w = list(c.words)
    made = [w[i + 1] for i, a in enumerate(w[:-1]) if a in ("-o", "--output")]
    return made + ([c.stdout_to] if c.stdout_to else []) + ([w[1]] if program(w[0]) == "cat" and c.output else [])


def _named_paths(words: tuple[str, ...]) -> list[str]:
    """The relative file paths among a command's words (``-m pkg.mod`` counts as ``pkg/mod.py``)."""
    out = []
    for i, word in enumerate(words):
        if i and words[i - 1] == "-m" and program(words[0]) in ("tfgpu", "python") and "launch" in words:
            out.append(word.replace(".", "/") + ".py")
        for part in re.split(r"[=:]", word):
            if PATH_WORD.fullmatch(part) and not part.startswith("/"):
                out.append(part)
    return out


def test_every_file_a_documented_command_names_exists():
    missing = []
    for path in DOCS:
        created: set[str] = set()
        for c in doc_commands(path):
            for name in _named_paths(c.words):
                if name not in created and name not in PLACEHOLDERS and not (ROOT / name).exists() \
                        and name not in _created(c):
                    missing.append(f"{c}\n  names {name}, which does not exist")
            created.update(_created(c))
    assert not missing, "\n".join(missing)


def test_every_repository_path_in_the_docs_exists():
    missing = []
    for path in DOCS:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in REPO_PATH.finditer(line):
                if not (ROOT / match.group(0)).exists() and match.group(0) not in HISTORICAL:
                    missing.append(f"{path.relative_to(ROOT)}:{n}: {match.group(0)}")
    assert not missing, "named in the docs but not in the repository:\n" + "\n".join(missing)


def test_every_file_in_the_help_examples_exists():
    missing = [f"{c}\n  names {p}" for c in help_examples() for p in _named_paths(c.words)
               if not (ROOT / p).exists() and p not in _created(c)]
    assert len(help_examples()) > 10
    assert not missing, "\n".join(missing)


def test_every_list_of_data_kinds_in_the_docs_is_complete():
    """Where the docs list the data kinds (``mnist | keras | ...`` or ``(`mnist`, `keras`, ...)``, 5 or more: shorter
    lists name a subset, such as the kinds JAX reads from memory), all are there."""
    from tfgpu.config.schema import DATA_KINDS  # noqa: PLC0415

    lists = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"\bmnist \| keras(?: \| \w+)+", text):
            lists.append((path, match.group(0).split(" | ")))
        for match in re.finditer(r"`mnist`,\s+`keras`(?:,\s+`\w+`)+", text):
            lists.append((path, re.findall(r"`(\w+)`", match.group(0))))
    lists = [(p, kinds) for p, kinds in lists if len(kinds) >= 5]
    assert len(lists) >= 3
    wrong = [f"{p.relative_to(ROOT)}: {kinds}" for p, kinds in lists if sorted(kinds) != sorted(DATA_KINDS)]
    assert not wrong, f"lists of data.kind other than {list(DATA_KINDS)}:\n" + "\n".join(wrong)


def test_the_readme_holds_the_ci_set_up_commands_verbatim():
    """.ci/run installs and tests with the README's own lines (each after a ``# README: ...`` comment)."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    lines = [ci[i + 1] for i, line in enumerate(ci[:-1]) if line.startswith("# README:")]
    assert lines == ['python3 -m venv .venv && .venv/bin/pip install -e ".[test]"', ".venv/bin/python -m pytest"]
    readme_lines = (ROOT / "README.md").read_text().splitlines()
    assert all(line in readme_lines for line in lines), lines
