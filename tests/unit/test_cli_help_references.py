"""What ``radserve ... --help`` points a user to exists: a ``docs/*.md`` file it names, and a
README section it names by title. ``radserve plan --help`` sent ``--host-cores`` readers to
"README: planner validation", a section the README does not have."""

from __future__ import annotations

import re
from pathlib import Path

import click

from radserve.cli import cli

ROOT = Path(__file__).resolve().parents[2]
DOC_PATH = re.compile(r"\bdocs/[\w./-]+\.md\b")
README_SECTION = re.compile(r"\(README: ([^)]+)\)")


def _help_texts(command: click.Command, path: str) -> list[tuple[str, str]]:
    """(where, text) for the command's own help and each of its options' help, unwrapped."""
    texts = [(path, command.help or "")]
    texts += [
        (f"{path} {param.opts[0]}", param.help or "")
        for param in command.params
        if isinstance(param, click.Option)
    ]
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None:
                texts += _help_texts(sub, f"{path} {name}")
    return texts


def _readme_headings() -> list[str]:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    return [line.lstrip("#").strip().lower() for line in lines if line.startswith("#")]


def test_every_reference_in_the_cli_help_resolves() -> None:
    headings = _readme_headings()
    texts = _help_texts(cli, "radserve")
    assert any(where == "radserve plan --host-cores" for where, _ in texts)  # walked them all
    broken = []
    for where, text in texts:
        flat = " ".join(text.split())
        broken += [
            f"{where}: {doc}" for doc in DOC_PATH.findall(flat) if not (ROOT / doc).is_file()
        ]
        broken += [
            f"{where}: README section {name!r}"
            for name in README_SECTION.findall(flat)
            if not any(name.strip().lower() in heading for heading in headings)
        ]
    assert broken == []
