"""Which modules a fresh interpreter has loaded after importing some: what a process
keeps resident (every module loaded stays in every serving, reader or CLI process)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

_PROBE = """
import importlib, json, sys
for name in sys.argv[2:]:
    importlib.import_module(name)
exec(sys.stdin.read())
print(json.dumps(sorted(m for m in json.loads(sys.argv[1]) if m in sys.modules)))
"""


def loaded_after(watched: Sequence[str], modules: Sequence[str], then: str = "") -> list[str]:
    """Which of ``watched`` a fresh interpreter has loaded after importing ``modules``
    and running the Python code ``then`` (what the process does next)."""
    args = [sys.executable, "-c", _PROBE, json.dumps(list(watched)), *modules]
    out = subprocess.run(args, input=then, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


__all__ = ["loaded_after"]
