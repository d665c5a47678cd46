"""Every input a fuzz target once failed on (tests/data/fuzz/<target>/<name>) now ends in
a declared refusal or is accepted. Runs the target's ``one_input`` directly: no atheris
needed, so these run wherever the test suite does.

The ``series`` target decodes pixel data in its own process, and its reproducers include
frames on which a native decoder ended the process (GDCM's SIGABRT / SIGSEGV, found by
tests/fuzz/codestream.py): each of those runs in a child interpreter, so a regression
fails its own test, naming the signal, instead of ending the test session."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.targets import TARGETS, entry

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "fuzz"
CASES = sorted(p for target in TARGETS for p in (DATA / target).glob("*") if p.is_file())
IN_A_CHILD = frozenset({"series"})  # targets that run native decoders in-process
_CHILD = (
    "import sys; from pathlib import Path; from tests.fuzz.targets import entry; "
    "entry(sys.argv[1])(Path(sys.argv[2]).read_bytes())"
)


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_reproducer_ends_in_a_declared_refusal(path: Path) -> None:
    target = path.parent.name
    if target not in IN_A_CHILD:
        entry(target)(path.read_bytes())
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, target, str(path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=120,
        check=False,
    )
    ended = (
        f"signal {signal.Signals(-done.returncode).name}"
        if done.returncode < 0
        else f"exit status {done.returncode}"
    )
    assert done.returncode == 0, (
        f"{path.name}: the target's process ended by {ended}\n" + (done.stderr[-4000:])
    )
