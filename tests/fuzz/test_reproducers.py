"""Every input a fuzz target once failed on (tests/data/fuzz/<target>/<name>) now ends in
a declared refusal or is accepted. Runs the target's ``one_input`` directly: no atheris
needed, so these run wherever the test suite does.

The ``series`` target decodes pixel data in its own process, and its reproducers include
frames on which a native decoder ended the process (GDCM's SIGABRT / SIGSEGV, found by
tests/fuzz/codestream.py): each of those runs in a child interpreter, so a regression
fails its own test, naming the signal, instead of ending the test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.factories.child_python import REPO, how_it_ended, run_python
from tests.fuzz.targets import TARGETS, entry, skip_without_needs

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
    skip_without_needs(target)
    if target not in IN_A_CHILD:
        entry(target)(path.read_bytes())
        return
    done = run_python(["-c", _CHILD, target, str(path)], timeout_s=120)
    ended = how_it_ended(done)
    assert done.returncode == 0, (
        f"{path.name}: the target's process ended by {ended}\n" + (done.stderr[-4000:])
    )
