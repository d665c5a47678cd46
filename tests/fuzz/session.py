"""One fuzzing session of one target in a child process (libFuzzer exits the process it
runs in): the seed corpus written (by that child, when the corpus folder is empty: a
second interpreter loading the target cost up to 6 CPU-s), atheris run with its limits,
the outcome read back. Used by the CI short mode (``test_fuzz_targets.py``) and the long
mode (``long.py``)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.factories.child_python import child_env

TIMEOUT_S = 10  # one input running longer is a finding (an unbounded loop)
RSS_LIMIT_MB = 3072  # the process growing past this is a finding (unbounded memory)
_STATS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+)")
_ARTIFACT = ("crash-", "timeout-", "oom-", "leak-")


@dataclass(frozen=True)
class Outcome:
    target: str
    returncode: int
    log: str
    artifacts: tuple[Path, ...]
    executions: int
    coverage: int  # libFuzzer's cov: (edges reached)
    features: int  # libFuzzer's ft:

    @property
    def found(self) -> bool:
        return self.returncode != 0 or bool(self.artifacts)

    def report(self) -> str:
        """What a failed run shows: each reproducer (path and bytes) and the log's tail."""
        lines = [f"fuzz target {self.target!r} found {len(self.artifacts)} input(s):"]
        for path in self.artifacts:
            data = path.read_bytes()
            lines.append(f"  {path} ({len(data)} bytes): {data[:512]!r}")
            lines.append(f"  reproduce: python -m tests.fuzz.run {self.target} {path}")
        lines.append("--- log (tail) ---")
        lines.append(self.log[-6000:])
        return "\n".join(lines)


def fuzz(
    target: str,
    work: Path,
    *,
    runs: int | None = None,
    seconds: int | None = None,
    seed: int = 1,
    log_file: Path | None = None,
) -> Outcome:
    """Run ``target`` from its seed corpus (kept in ``work/corpus``, grown by the run)
    for ``runs`` inputs or ``seconds``; reproducers land in ``work/artifacts``."""
    corpus, artifacts = work / "corpus", work / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    env = child_env()
    flags = [
        f"-seed={seed}",
        f"-timeout={TIMEOUT_S}",
        f"-rss_limit_mb={RSS_LIMIT_MB}",
        f"-artifact_prefix={artifacts}/",
        "-print_final_stats=1",
    ]
    if runs is not None:
        flags.append(f"-runs={runs}")
    if seconds is not None:
        flags.append(f"-max_total_time={seconds}")
    command = [sys.executable, "-m", "tests.fuzz.run", target, *flags, str(corpus)]
    done = subprocess.run(
        command, cwd=work, env=env, capture_output=True, text=True, errors="replace", check=False
    )
    log = done.stdout + done.stderr
    if log_file is not None:
        log_file.write_text(log)
    stats = _STATS.findall(log)
    execs, cov, ft = (int(v) for v in stats[-1]) if stats else (0, 0, 0)
    found = tuple(sorted(p for p in artifacts.iterdir() if p.name.startswith(_ARTIFACT)))
    return Outcome(target, done.returncode, log, found, execs, cov, ft)


__all__ = ["Outcome", "fuzz"]
