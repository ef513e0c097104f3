"""Container images, checked without a Docker engine: the Dockerfiles, `make images` and the chart.

What a build would reveal late, found here early: the entry point is the package's console
script and its default subcommand exists, the user is not root (and is the UID the pod
templates run as), base images are pinned, the compactor carries Java 17 and a scratch
directory, the operator image works without PySpark (which it drops), and every image tag —
`make images`, the operator's default compactor image, the chart — follows pyproject.toml.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from kompaktor import __version__
from kompaktor.cli import COMMANDS, main
from kompaktor.resources.models import CompactorGroupSpec
from kompaktor.resources.operator_config import OperatorConfig
from kompaktor_operator import manifests, naming

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: the one version source (pyproject.toml reads it: [tool.hatch.version])
VERSION = __version__
CHART = ROOT / "helm" / "kompaktor"
#: image -> the subcommand its CMD must run
IMAGES = {"operator": "operator", "compactor": "compactor"}
#: PID-1 helpers allowed in front of the console script, with the arguments that end their own
INIT_PREFIXES = {"tini": "--", "/usr/bin/tini": "--", "/sbin/tini": "--"}
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/env"}


# --- a small Dockerfile reader --------------------------------------------------------------


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, keyword: str) -> str | None:
        found = [args for kw, args in self.instructions if kw == keyword]
        return found[-1] if found else None

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]


def _logical_lines(text: str) -> list[str]:
    """Instructions with their continuation lines joined; comments and blank lines dropped."""
    lines, buf = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        lines.append(buf + stripped)
        buf = ""
    if buf.strip():
        lines.append(buf)
    return lines


def _substitute(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


def parse_dockerfile(path: Path) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(path.read_text()):
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--platform")]
            image = _substitute(words[0], global_args)
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(image=image, name=name))
        elif not stages:
            assert keyword == "ARG", f"{path}: only ARG may precede the first FROM, got {keyword}"
            key, _, default = args.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append((keyword, args))
    assert stages, f"{path}: no FROM"
    return Dockerfile(global_args, stages)


def exec_form(args: str | None) -> list[str]:
    assert args is not None
    assert args.startswith("["), f"not exec form (a shell would be PID 1 and swallow SIGTERM): {args}"
    value = json.loads(args)
    assert isinstance(value, list) and value and all(isinstance(v, str) for v in value)
    return value


def program(entrypoint: list[str]) -> list[str]:
    """The entry point without a PID-1 helper such as `tini --`."""
    if entrypoint[0] in INIT_PREFIXES:
        end = entrypoint.index(INIT_PREFIXES[entrypoint[0]])
        return entrypoint[end + 1 :]
    return entrypoint


def dockerfile(image: str) -> Dockerfile:
    path = ROOT / image / "Dockerfile"
    assert path.is_file(), f"{path} is missing"
    return parse_dockerfile(path)


def run_text(stage: Stage) -> str:
    return "\n".join(stage.all("RUN"))


def image_uid(stage: Stage) -> int:
    """The numeric UID the final stage runs as (a named user must be created with a UID)."""
    user = stage.last("USER")
    assert user, "the final stage sets no USER, so it runs as root"
    name = user.split(":")[0]
    if name == "root":
        return 0
    if name.isdigit():
        return int(name)
    match = re.search(rf"useradd\b[^\n;&|]*?(?:--uid|-u)[ =](\d+)[^\n;&|]*\b{re.escape(name)}\b", run_text(stage))
    assert match, f"USER {name} is not created with an explicit UID in the final stage"
    return int(match.group(1))


# --- the Dockerfiles -------------------------------------------------------------------------


def test_the_test_reads_dockerfiles_as_docker_does(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(
        "ARG BASE=python:3.11-slim\n# c\nFROM ${BASE} AS b\nRUN a \\\n  && b\n"
        'FROM --platform=linux/amd64 debian:12\nUSER app\nCMD ["x"]\n'
    )
    parsed = parse_dockerfile(path)
    assert [(s.image, s.name) for s in parsed.stages] == [("python:3.11-slim", "b"), ("debian:12", None)]
    assert parsed.stages[0].instructions == [("RUN", "a  && b")]
    assert parsed.final.last("USER") == "app"
    assert program(["/usr/bin/tini", "--", "kompaktor", "x"]) == ["kompaktor", "x"]
    with pytest.raises(AssertionError):
        exec_form("kompaktor operator")


@pytest.mark.parametrize("image", IMAGES)
def test_final_stage_runs_as_the_non_root_uid_of_the_pod_templates(image: str) -> None:
    uid = image_uid(dockerfile(image).final)
    assert uid > 0
    # The operator's compactor pods and the chart's operator pod both run as this UID.
    pod = manifests.build_pod_template("g", CompactorGroupSpec(), OperatorConfig())
    assert pod["spec"]["securityContext"]["runAsUser"] == uid


@pytest.mark.parametrize("image", IMAGES)
def test_entrypoint_is_the_console_script_in_exec_form(image: str) -> None:
    entrypoint = exec_form(dockerfile(image).final.last("ENTRYPOINT"))
    assert entrypoint[0] not in SHELLS
    command = program(entrypoint)
    assert command == ["kompaktor"], f"ENTRYPOINT should run the console script, got {entrypoint}"
    assert PYPROJECT["project"]["scripts"]["kompaktor"] == "kompaktor.cli:main"


@pytest.mark.parametrize(("image", "subcommand"), IMAGES.items())
def test_cmd_is_an_existing_subcommand(image: str, subcommand: str) -> None:
    cmd = exec_form(dockerfile(image).final.last("CMD"))
    assert cmd[0] == subcommand
    assert cmd[0] in COMMANDS
    assert main.get_command(click.Context(main), cmd[0]) is not None, f"`kompaktor {cmd[0]}` does not import"


@pytest.mark.parametrize("image", IMAGES)
def test_base_images_are_pinned(image: str) -> None:
    parsed = dockerfile(image)
    names = {s.name for s in parsed.stages if s.name}
    for stage in parsed.stages:
        if stage.image in names:
            continue
        assert "$" not in stage.image, f"unresolved base image {stage.image}"
        ref, _, digest = stage.image.partition("@")
        last = ref.rsplit("/", 1)[-1]
        assert ":" in last, f"{stage.image}: no tag"
        tag = last.split(":", 1)[1]
        assert tag and tag != "latest", f"{stage.image}: unpinned tag"
        assert not digest or re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{stage.image}: malformed digest"


@pytest.mark.parametrize("image", IMAGES)
def test_package_is_built_from_the_repository_and_installed_offline(image: str) -> None:
    """The wheel is built from the working tree on the host (scripts/build-images.sh); a first
    stage installs it and exactly its dependencies, offline, into a venv under /opt (works on the
    python slim image and on a plain Debian base alike), which the runtime stage copies."""
    parsed = dockerfile(image)
    assert len(parsed.stages) >= 2, "expected a multi-stage build"
    script = (ROOT / "scripts" / "build-images.sh").read_text()
    assert re.search(r"pip_wheel --no-deps --wheel-dir \S+ \.", script), "the package wheel comes from the repo"
    installs = [run_text(s) for s in parsed.stages[:-1]]
    assert any(
        "python3 -m venv /opt/kompaktor" in t and "--no-index" in t and "--find-links=/wheels" in t for t in installs
    ), installs
    assert any(args.startswith("--from=") and "/opt/kompaktor" in args for args in parsed.final.all("COPY"))
    assert "/usr/local/bin/pip" not in (ROOT / image / "Dockerfile").read_text()
    assert "/opt/kompaktor/bin" in " ".join(parsed.final.all("ENV"))
    assert parsed.final.last("EXPOSE") == str(naming.HTTP_PORT)


def test_compactor_image_has_java_17_and_a_scratch_dir() -> None:
    final = dockerfile("compactor").final
    assert re.search(r"\bopenjdk-17-jre(-headless)?\b", run_text(final)), "no Java 17 runtime installed"
    env = " ".join(final.all("ENV"))
    assert f"SPARK_LOCAL_DIRS={manifests.SCRATCH_DIR}" in env
    uid = image_uid(final)
    assert re.search(rf"install -d -o {uid} -g \d+ -m \d+ {manifests.SCRATCH_DIR}\b", run_text(final)), (
        f"{manifests.SCRATCH_DIR} must exist and belong to UID {uid}"
    )


def _runs_clean(code: str) -> None:
    """``code`` passes in a fresh interpreter that imports the package from this tree."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "compactor"), str(ROOT / "operator")])}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_compactor_image_works_without_the_operator_extra() -> None:
    """The compactor image installs only the spark extra: the compactor never imports kopf or the
    asyncio Kubernetes client, and ``kompaktor operator`` there fails with one line naming the
    extra."""
    text = (ROOT / "compactor" / "Dockerfile").read_text()
    assert '"kompaktor[spark]==${VERSION}"' in text and "operator]" not in text
    code = (
        "import sys\n"
        "sys.modules['kopf'] = sys.modules['kubernetes_asyncio'] = sys.modules['aiohttp'] = None\n"
        "import importlib, pkgutil, kompaktor\n"
        "for m in pkgutil.walk_packages(kompaktor.__path__, 'kompaktor.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "from click.testing import CliRunner\n"
        "from kompaktor.cli import main\n"
        "r = CliRunner().invoke(main, ['compactor', '--help'])\n"
        "assert r.exit_code == 0, (r.output, r.exception)\n"
        "r = CliRunner().invoke(main, ['operator', '--redis', 'redis://127.0.0.1:1/0'])\n"
        "assert r.exit_code == 1 and \"pip install 'kompaktor[operator]'\" in r.output, (r.output, r.exception)\n"
        "assert len(r.output.strip().splitlines()) == 1, r.output\n"
    )
    _runs_clean(code)


def test_operator_image_works_without_pyspark() -> None:
    """The operator image never installs PySpark (an extra it does not ask for); the operator and
    the coordinator (which runs from the same image) must not import it."""
    text = (ROOT / "operator" / "Dockerfile").read_text()
    assert '"kompaktor[operator]==${VERSION}"' in text and "[spark]" not in text and "pyspark" not in text.split("#")[0]
    assert 'spark = ["pyspark' in (ROOT / "pyproject.toml").read_text()
    code = (
        "import sys\n"
        "sys.modules['pyspark'] = sys.modules['py4j'] = None\n"
        "import kompaktor.coordinator, kompaktor.cli.coordinator\n"
        "import kompaktor_operator.handlers, kompaktor_operator.commands\n"
        "from click.testing import CliRunner\n"
        "from kompaktor.cli import main\n"
        "for cmd in ('operator', 'coordinator'):\n"
        "    r = CliRunner().invoke(main, [cmd, '--help'])\n"
        "    assert r.exit_code == 0, (cmd, r.output, r.exception)\n"
    )
    _runs_clean(code)


# --- versions: kompaktor.__version__ is the one place -----------------------------------------


def built_tags() -> dict[str, str]:
    """Image (operator/compactor/redis) -> the tag `make images` gives it (the build script's
    --list, with the Makefile's variables)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-images.sh"), "--list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    tags = {}
    for line in out.splitlines():
        name, ref, path = line.split()
        assert (ROOT / path).is_file(), path
        tags[name] = ref
    return tags


def test_package_version_has_one_source() -> None:
    """pyproject.toml spells no version: hatchling reads ``__version__`` (a second literal would
    drift from it)."""
    assert "version" not in PYPROJECT["project"]
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "compactor/kompaktor/__init__.py"
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)


def test_make_images_tags_every_image_with_the_package_version() -> None:
    tags = built_tags()
    assert set(tags) == {*IMAGES, "redis"}
    for tag in tags.values():
        assert tag.endswith(f":{VERSION}")
    # A CompactorGroup without an image runs the compactor image `make images` builds.
    assert OperatorConfig().compactor_image == tags["compactor"]


@pytest.mark.parametrize(
    ("tool", "message"),
    [("docker", "no Docker engine reachable"), ("kaniko", "CONTAINER_TOOL must be docker, podman or buildah")],
)
def test_make_images_fails_clearly_with_a_tool_it_cannot_use(tmp_path: Path, tool: str, message: str) -> None:
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock", "CONTAINER_TOOL": tool}
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-images.sh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def chart_files() -> tuple[dict[str, Any], dict[str, Any], str]:
    started = any((CHART / p).exists() for p in ("Chart.yaml", "values.yaml", "templates"))
    if not started:
        pytest.skip(f"no Helm chart at {CHART.relative_to(ROOT)} yet")
    assert (CHART / "Chart.yaml").is_file(), "the chart has values or templates but no Chart.yaml"
    assert (CHART / "values.yaml").is_file(), "the chart has no values.yaml"
    templates = "\n".join(p.read_text() for p in sorted((CHART / "templates").glob("*")) if p.is_file())
    return (
        yaml.safe_load((CHART / "Chart.yaml").read_text()),
        yaml.safe_load((CHART / "values.yaml").read_text()),
        templates,
    )


def images_in(values: Any, path: str = "") -> dict[str, dict[str, Any]]:
    """Every `image:` mapping with a repository in the values, by its dotted path."""
    found = {}
    if isinstance(values, dict):
        for key, value in values.items():
            here = f"{path}.{key}" if path else key
            if key == "image" and isinstance(value, dict) and "repository" in value:
                found[here] = value
            else:
                found.update(images_in(value, here))
    return found


def test_chart_app_version_is_the_package_version() -> None:
    chart, _, _ = chart_files()
    assert str(chart["appVersion"]) == VERSION


def test_chart_default_images_are_the_ones_make_images_builds() -> None:
    _, values, templates = chart_files()
    ours = {path: image for path, image in images_in(values).items() if "kompaktor" in image["repository"]}
    expected = {name: tag.rsplit(":", 1)[0] for name, tag in built_tags().items()}
    assert {image["repository"] for image in ours.values()} == set(expected.values())
    for path, image in ours.items():
        tag = image.get("tag")
        if tag:
            assert str(tag) == VERSION, f"{path}.tag {tag!r}: leave it empty to follow appVersion"
        else:
            actions = re.findall(r"\{\{.*?\}\}", templates, flags=re.S)
            assert any(f".Values.{path}.tag" in a and ".Chart.AppVersion" in a for a in actions), (
                f"{path}.tag is empty, but no template defaults it to .Chart.AppVersion"
            )
