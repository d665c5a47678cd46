"""Every setting, ``RADSERVE_*`` variable, ``radserve`` command and flag, HTTP endpoint,
module and path that README.md and docs/*.md name exists (and deploy/'s variables are
settings).

A reader copies ``gateway.quiet_s`` or ``radserve outbox list --destination`` from the
documentation; a setting that was renamed fails the server at start ("unknown setting"),
and a flag that was renamed fails the command. Neither shows in the documentation until a
reader trips over it, so this reads the documentation the way a reader does and checks
each name against the settings schema (:class:`radserve.config.Settings`) and the click
commands (:data:`radserve.cli.cli`). docs/history/ is a record of what was, not checked.

What is checked:

- dotted names in code spans whose first part is a settings section (``ingest.max_frames``);
  a name that is not a setting must be an audit action (``outbox.retried``), a database
  column (``jobs.lease_renewed``), a radserve module or attribute (``ingest.rules``) or a
  file name (``console.md``) — else it is reported;
- ``RADSERVE_SECTION__KEY`` variables anywhere (the test and training variables aside);
- the keys of fenced YAML blocks whose top-level keys are all settings sections;
- ``radserve ...`` command lines in code spans and fenced blocks: the subcommands, each
  ``--flag``, and a value given to a flag with fixed choices (``--scenario priority``);
- ``GET /v1/jobs/{id}/deliveries``-style endpoints under radserve's own top-level paths
  (``/v1``, ``/dicomweb``, ...; another server's, such as Orthanc's, are not checked):
  the method and path, parameters named as the reader likes;
- ``radserve.*`` and ``tests.*`` modules and attributes (``radserve.durable.batch``), and
  paths under tests/, tools/, src/, deploy/, docs/ (``tools/eta_floor.py``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import shlex
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from pydantic import BaseModel, RootModel

from radserve.audit.events import Action
from radserve.cli import cli
from radserve.config import _NOT_SETTINGS, Settings
from radserve.store.models import Base

ROOT = Path(__file__).resolve().parents[2]

_FENCE = re.compile(r"^\s*(```|~~~)\s*(\w*)")
# names that look like settings but are another project's API or a host name
_OTHER_NAMES = frozenset({"ray.put", "fhir.resources"})
_FILE_SUFFIXES = frozenset({"py", "md", "json", "yaml", "yml", "toml", "gz", "png", "txt"})
# names in the documentation that look like commands and are not, on purpose
_NOT_COMMANDS = frozenset(
    {
        "`radserve models drift-reference`: no such command",  # models.md: not done yet
        "`radserve lane`: no such command",  # a PostgreSQL session's name (scale-out.md)
        "`radserve senders`: no such command",  # likewise
        "`radserve readers`: no such command",  # a bench row's label (api-performance.md)
    }
)
# dotted names under radserve that are not modules: logger names
_NOT_MODULES = frozenset({"radserve.native_stderr"})
# paths the reader creates (docs/deployment.md)
_CREATED_BY_READER = frozenset({"deploy/.env", "deploy/secrets", "deploy/secrets/audit_key"})
_SHELL_ENDS = frozenset({"|", "||", "&&", ";", ">", ">>", "2>&1", "&", "#"})


def doc_files() -> list[Path]:
    """README.md and the topic files under docs/ (not docs/history/)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def split_fences(text: str) -> tuple[str, list[tuple[str, str, int]]]:
    """The prose (fenced lines blanked, so line numbers hold) and each fenced block as
    (language, body, first line number)."""
    prose: list[str] = []
    blocks: list[tuple[str, str, int]] = []
    current: list[str] | None = None
    language, start = "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        fence = _FENCE.match(line)
        if current is None and fence:
            current, language, start = [], fence.group(2), number + 1
            prose.append("")
        elif current is not None and fence:
            blocks.append((language, "\n".join(current), start))
            current = None
            prose.append("")
        elif current is not None:
            current.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), blocks


def code_spans(prose: str) -> Iterator[tuple[str, int]]:
    """Each inline code span (it may run over a line break) with its line number."""
    for match in re.finditer(r"(`+)(.+?)\1", prose, flags=re.DOTALL):
        yield match.group(2).replace("\n", " "), prose.count("\n", 0, match.start()) + 1


# -- settings ---------------------------------------------------------------------------


def _args(annotation: Any) -> tuple[Any, ...]:
    return tuple(a for a in typing.get_args(annotation) if a is not Ellipsis)


def _step(annotation: Any, part: str) -> tuple[bool, Any]:
    """Whether ``part`` is a key under a value of type ``annotation``, and its type."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _step(_args(annotation)[0], part)
    if origin in (typing.Union, types.UnionType) or origin in (tuple, list):
        for arg in _args(annotation):  # Optional, or the items of a list of sections
            found, inner = _step(arg, part)
            if found:
                return True, inner
        return False, None
    if origin is dict:
        return True, _args(annotation)[1]
    if isinstance(annotation, type) and issubclass(annotation, RootModel):
        return _step(annotation.model_fields["root"].annotation, part)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        fields = {f.alias or name: f for name, f in annotation.model_fields.items()}
        fields.update(annotation.model_fields)
        if part in fields:
            return True, fields[part].annotation
        # a documented prefix (``fhir.retry_*``) names the fields that start with it
        if part.endswith("_") and any(name.startswith(part) for name in fields):
            return True, None
    return False, None


def is_setting(path: list[str]) -> bool:
    annotation: Any = Settings
    for part in path:
        found, annotation = _step(annotation, part)
        if not found:
            return False
    return True


def _is_module_or_attribute(dotted: str, package: str = "radserve.") -> bool:
    parts = (package + dotted).split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            spec = importlib.util.find_spec(module_name)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            continue
        target: Any = importlib.import_module(module_name)
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


_ACTIONS = frozenset(action.value for action in Action)
_COLUMNS = frozenset(
    f"{table.name}.{column.name}" for table in Base.metadata.tables.values() for column in table.c
)


def explained_otherwise(dotted: str) -> bool:
    """A dotted name that is not a setting but names something that exists."""
    return (
        dotted in _OTHER_NAMES
        or dotted.rsplit(".", 1)[-1] in _FILE_SUFFIXES
        or dotted in _ACTIONS
        or dotted in _COLUMNS
        or _is_module_or_attribute(dotted)
    )


def _dotted_names(text: str) -> Iterator[str]:
    sections = "|".join(sorted(Settings.model_fields, key=len, reverse=True))
    pattern = rf"(?<![\w./:@-])(?:{sections})(?:\.\w+)+(?![\w/(-])"
    for match in re.finditer(pattern, text):
        yield match.group(0).rstrip(".")


def unknown_dotted_settings(path: Path) -> list[str]:
    prose, _ = split_fences(path.read_text(encoding="utf-8"))
    problems = []
    for span, line in code_spans(prose):
        for dotted in _dotted_names(span):
            if not is_setting(dotted.split(".")) and not explained_otherwise(dotted):
                problems.append(f"{path.name}:{line}: `{dotted}` is no setting")
    return problems


def unknown_variables(path: Path) -> list[str]:
    problems = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for name in re.findall(r"\bRADSERVE_[A-Z0-9_]*[A-Z0-9]", line):
            if _NOT_SETTINGS.match(name):  # the config file path, test and training tools
                continue
            keys = name.removeprefix("RADSERVE_").lower().split("__")
            if not is_setting(keys):
                problems.append(f"{path.name}:{number}: {name} is no setting")
    return problems


def _yaml_keys(value: Any, annotation: Any, where: str) -> Iterator[str]:
    if isinstance(value, list):
        for item in value:
            yield from _yaml_keys(item, annotation, where)
        return
    if not isinstance(value, dict):
        return
    for key, inner in value.items():
        found, inner_type = _step(annotation, str(key))
        if not found:
            yield f"{where}{key}"
        elif inner_type is not None:
            yield from _yaml_keys(inner, inner_type, f"{where}{key}.")


def unknown_yaml_settings(path: Path) -> list[str]:
    _, blocks = split_fences(path.read_text(encoding="utf-8"))
    problems = []
    for language, body, line in blocks:
        if language not in ("yaml", "yml"):
            continue
        try:
            data = yaml.safe_load(body)
        except yaml.YAMLError as exc:
            problems.append(f"{path.name}:{line}: YAML block does not parse: {exc}")
            continue
        if (
            not isinstance(data, dict)
            or not set(data) <= set(Settings.model_fields)
            or re.search(r"#.*(model\.yaml|pipelines/)", body)
        ):
            continue  # a model.yaml, pipeline or compose file, not settings
        problems += [
            f"{path.name}:{line}: YAML block: `{key}` is no setting"
            for key in _yaml_keys(data, Settings, "")
        ]
    return problems


# -- command lines ----------------------------------------------------------------------


def _command_lines(path: Path) -> Iterator[tuple[str, int]]:
    prose, blocks = split_fences(path.read_text(encoding="utf-8"))
    for span, line in code_spans(prose):
        yield span, line
    for _, body, start in blocks:
        joined = re.sub(r"\\\n", " ", body)
        for offset, line in enumerate(joined.splitlines()):
            yield re.sub(r"(^|\s)#.*", "", line), start + offset


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote in prose-like text
        return line.split()


def _options(command: click.Command) -> dict[str, click.Parameter]:
    """The command's ``--`` options, with the help option click adds to every command
    (it is not among ``command.params``)."""
    help_option = command.get_help_option(click.Context(command))
    params = [*command.params, *([help_option] if help_option else [])]
    return {
        opt: param
        for param in params
        for opt in (*param.opts, *param.secondary_opts)
        if opt.startswith("--")
    }


def check_command_line(words: list[str]) -> list[str]:
    """What in one ``radserve ...`` invocation (the words after ``radserve``) does not
    exist: a subcommand, a ``--flag``, or a value outside a flag's fixed choices."""
    command: click.Command = cli
    options = _options(cli)
    name = "radserve"
    problems: list[str] = []
    index = 0
    while isinstance(command, click.Group) and index < len(words):
        word = words[index]
        if word.startswith("-") or not re.fullmatch(r"[a-z][a-z0-9-]*", word):
            break
        sub = command.get_command(click.Context(command), word)
        if sub is None:
            problems.append(f"`{name} {word}`: no such command")
            return problems
        command, name = sub, f"{name} {word}"
        options.update(_options(command))
        index += 1
    for position, word in enumerate(words[index:], start=index):
        if word in _SHELL_ENDS:
            break
        word = word.strip("[]()|,")
        if not word.startswith("--") or word == "--":
            continue
        flag, _, value = word.partition("=")
        param = options.get(flag)
        if param is None:
            problems.append(f"`{name}` has no option {flag}")
            continue
        if not value and position + 1 < len(words):
            value = words[position + 1]
        choices = param.type.choices if isinstance(param.type, click.Choice) else None
        if choices and re.fullmatch(r"[a-z0-9_][a-z0-9_-]*", value) and value not in choices:
            problems.append(f"`{name} {flag} {value}`: not one of {list(param.type.choices)}")
    return problems


def unknown_command_parts(path: Path) -> list[str]:
    problems = []
    for text, line in _command_lines(path):
        words = _words(text)
        for index, word in enumerate(words):
            # the program, not an option's value (``docker compose -p radserve``)
            if (word == "radserve" or word.endswith("/radserve")) and not (
                index and words[index - 1].startswith("-")
            ):
                found = check_command_line(words[index + 1 :])
                problems += [f"{path.name}:{line}: {p}" for p in found if p not in _NOT_COMMANDS]
    return problems


# -- HTTP endpoints ----------------------------------------------------------------------

_ENDPOINT = re.compile(r"\b(GET|POST|PUT|DELETE|PATCH) (/[\w/{}.-]*[\w}])")


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


@functools.cache
def _routes() -> frozenset[tuple[str, str]]:
    from radserve.api.routes import dicomweb, jobs, models, ops, studies, turnaround
    from radserve.console import routes as console

    routers = [m.router for m in (dicomweb, jobs, models, ops, studies, turnaround)]
    routers += [console.router, console.api_router]
    return frozenset(
        (method, _shape(route.path))
        for router in routers
        for route in router.routes
        for method in getattr(route, "methods", None) or ()
    )


def unknown_endpoints(path: Path) -> list[str]:
    routes = _routes()
    prefixes = {shape.split("/")[1] for _, shape in routes}
    problems = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for method, endpoint in _ENDPOINT.findall(line):
            if endpoint.split("/")[1] in prefixes and (method, _shape(endpoint)) not in routes:
                problems.append(f"{path.name}:{number}: no endpoint {method} {endpoint}")
    return problems


# -- modules and paths -----------------------------------------------------------------

_MODULE_NAME = re.compile(r"(?<![\w/-])(?:radserve|tests)\.[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_PATH = re.compile(r"(?<![\w./-])(?:tests|tools|src|deploy|docs|\.ci)/[\w./-]+")


def unknown_modules_and_paths(path: Path) -> list[str]:
    problems = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for dotted in _MODULE_NAME.findall(line):
            if dotted.rsplit(".", 1)[-1] in _FILE_SUFFIXES or dotted in _NOT_MODULES:
                continue
            if not _is_module_or_attribute(dotted, package=""):
                problems.append(f"{path.name}:{number}: {dotted} is no module or attribute")
        for match in _PATH.finditer(line):
            if line[match.end() : match.end() + 1] in ("*", "{", "<", "["):
                continue  # a pattern (`tests/e2e/test_console_*.py`), not one path
            name = match.group(0).rstrip(".")
            if name not in _CREATED_BY_READER and not (ROOT / name).exists():
                problems.append(f"{path.name}:{number}: {name} does not exist")
    return problems


# -- the checks -------------------------------------------------------------------------

_CHECKS = {
    "dotted settings": unknown_dotted_settings,
    "RADSERVE_ variables": unknown_variables,
    "YAML settings blocks": unknown_yaml_settings,
    "radserve command lines": unknown_command_parts,
    "modules and paths": unknown_modules_and_paths,
    "HTTP endpoints": unknown_endpoints,
}


DEPLOY_FILES = ["deploy/compose.yaml", "deploy/.env.example", "deploy/Dockerfile",
                "deploy/docker-entrypoint.sh", "deploy/radserve.yaml"]  # fmt: skip


@pytest.mark.parametrize("name", DEPLOY_FILES)
def test_every_radserve_variable_of_the_deployment_files_is_a_setting(name: str) -> None:
    """A ``RADSERVE_*`` variable that is not a setting stops every radserve command that
    sees it ("unknown setting"): compose's image tag was ``RADSERVE_IMAGE``, so a shell
    that sourced deploy/.env could run no radserve command."""
    assert unknown_variables(ROOT / name) == []


@pytest.mark.parametrize("check", list(_CHECKS))
@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_setting_and_flag_exists(path: Path, check: str) -> None:
    assert _CHECKS[check](path) == []


def test_a_renamed_setting_variable_or_flag_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Set `gateway.quiet_s` and `gateway.quiet_seconds`; `outbox.retried` is audited,\n"
        "`jobs.lease_renewed` a column, `ingest.rules` a module, `console.md` a file.\n"
        "RADSERVE_SCHEDULER__MAX_RUNNING=2 RADSERVE_SCHEDULER__MAX_RUN=2 RADSERVE_TEST_X=1\n"
        "`radserve outbox list --state sent --json` `radserve outbox list --destinaton X`\n"
        "`radserve bench --scenario priority` `radserve bench --scenario nonsense`\n"
        "`radserve.durable.batch` `radserve.durable.btach` `tools/eta_floor.py` `tools/no.py`\n"
        "GET /v1/jobs/{id}/deliveries, GET /v1/jobs/{job}/delivery, POST /modalities/x/store\n"
        "`radserve modles list` `docker compose -p radserve -f x.yaml --env-file .env`\n"
        "```yaml\ngateway: {quiet_s: 10, quiet: 3}\njobs: {timeout_s: 900}\n```\n"
        "```yaml\nname: organs\nsteps: []\n```\n",
        encoding="utf-8",
    )
    assert unknown_dotted_settings(page) == ["page.md:1: `gateway.quiet_seconds` is no setting"]
    assert unknown_variables(page) == ["page.md:3: RADSERVE_SCHEDULER__MAX_RUN is no setting"]
    assert unknown_yaml_settings(page) == ["page.md:10: YAML block: `gateway.quiet` is no setting"]
    assert unknown_modules_and_paths(page) == [
        "page.md:6: radserve.durable.btach is no module or attribute",
        "page.md:6: tools/no.py does not exist",
    ]
    assert unknown_endpoints(page) == ["page.md:7: no endpoint GET /v1/jobs/{job}/delivery"]
    problems = unknown_command_parts(page)
    assert problems[0] == "page.md:4: `radserve outbox list` has no option --destinaton"
    assert problems[1].startswith("page.md:5: `radserve bench --scenario nonsense`: not one of")
    assert problems[2:] == ["page.md:8: `radserve modles`: no such command"]
