"""dciodvfy (dicom3tools), the DICOM validator the tests hold every written object to: one
way to call it and read its findings (it writes them to stderr, some builds to stdout)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def dciodvfy_report(path: Path) -> str:
    """Everything dciodvfy printed for one file."""
    run = subprocess.run(
        ["dciodvfy", str(path)],
        capture_output=True,
        encoding="utf-8",
        errors="replace",  # it quotes values in the object's character set (GB18030, ...)
        timeout=120,
        check=False,
    )
    return run.stdout + run.stderr


def dciodvfy_errors(path: Path) -> list[str]:
    """dciodvfy's "Error" lines for one file."""
    return [line for line in dciodvfy_report(path).splitlines() if "Error" in line]


def dciodvfy_findings(path: Path) -> list[str]:
    """dciodvfy's "Error" and "Warning" lines for one file."""
    return [
        line for line in dciodvfy_report(path).splitlines() if "Error" in line or "Warn" in line
    ]
