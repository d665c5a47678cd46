"""YAML as radserve reads it (model.yaml, pipeline files, the config file): PyYAML's safe
loader, with the document's size bounded as it would be once aliases are expanded.

A mapping that gives one key twice is refused (PyYAML keeps the last value silently).

``yaml.safe_load`` keeps an alias as a reference, so a 500-byte "billion laughs" file
(ten anchors, each nine aliases of the one before) loads at once; whatever walks the
result then meets 9**10 leaves: pydantic's refusal of it ran for minutes. A document
whose expansion exceeds :data:`MAX_NODES` is refused before it is constructed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["MAX_NODES", "load_yaml", "load_yaml_file", "read_utf8"]

MAX_NODES = 1_000_000  # a model.yaml with every option set is a few hundred nodes


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Nodes in ``node``'s tree with every alias expanded (each shared node sized once)."""
    if id(node) in sizes:
        return sizes[id(node)]
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(
            _expanded_size(key, sizes) + _expanded_size(value, sizes) for key, value in node.value
        )
    else:
        size = 1
    sizes[id(node)] = size
    return size


def _refuse_duplicate_keys(node: yaml.Node, walked: set[int]) -> None:
    """Raise for a mapping that gives one key twice. PyYAML keeps the last value without a
    word (TOML refuses it): a config file's second ``port:`` quietly replaced the first,
    and the operator read the first. Each shared (aliased) node is walked once."""
    if id(node) in walked:
        return
    walked.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], yaml.Node] = {}
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                earlier = first.setdefault((key.tag, key.value), key)
                if earlier is not key:
                    raise yaml.YAMLError(
                        f"{_at(key.start_mark)}: the key {key.value!r} is given twice (first "
                        f"at {_at(earlier.start_mark)}); keep one"
                    )
    if isinstance(node, yaml.SequenceNode | yaml.MappingNode):
        for child in node.value:
            for part in child if isinstance(child, tuple) else (child,):
                _refuse_duplicate_keys(part, walked)


def _at(mark: yaml.Mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _one_line(exc: yaml.MarkedYAMLError) -> str:
    """PyYAML's error in one line, where first (``line 3, column 8: mapping values are
    not allowed here``). Its own text quoted the line under a caret and named the file
    ``"<unicode string>"``; the command line's redaction then read the lone ``^`` as a
    name and printed ``<redacted>`` where the caret pointed."""
    mark = exc.problem_mark or exc.context_mark
    text = f"{_at(mark)}: " if mark is not None else ""
    text += exc.problem or exc.context or "not valid YAML"
    if exc.problem and exc.context:
        text += f" ({exc.context}"
        if exc.context_mark is not None and exc.context_mark is not mark:
            text += f" at {_at(exc.context_mark)}"
        text += ")"
    return text


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, refusing (``yaml.YAMLError``) a document larger than
    :data:`MAX_NODES` nodes with its aliases expanded, or nested too deeply to read."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {})
        if size > MAX_NODES:
            raise yaml.YAMLError(
                f"the document has {size:,} nodes with its aliases expanded "
                f"(at most {MAX_NODES:,}): an alias bomb?"
            )
        _refuse_duplicate_keys(node, set())
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        raise yaml.YAMLError(_one_line(exc)) from None
    except RecursionError as exc:
        raise yaml.YAMLError("the document is nested too deeply to read") from exc
    finally:
        loader.dispose()


def read_utf8(path: Path) -> str:
    """The text of a configuration file (YAML, TOML): UTF-8, as both formats define it. A
    file in another encoding raises :class:`UnicodeDecodeError` (a ValueError) naming the
    byte; :class:`OSError` passes through."""
    return path.read_bytes().decode("utf-8")


def load_yaml_file(path: Path) -> Any:
    """:func:`load_yaml` of the file at ``path``. A file that is not UTF-8 (a model.yaml
    saved as Latin-1, a stray binary) is refused as a ``yaml.YAMLError`` naming the byte,
    which every caller already turns into its refusal; it escaped them as a
    UnicodeDecodeError (found by fuzzing the settings loaders). :class:`OSError` passes
    through."""
    try:
        text = read_utf8(path)
    except UnicodeDecodeError as exc:
        raise yaml.YAMLError(
            f"not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
        ) from None
    return load_yaml(text)
