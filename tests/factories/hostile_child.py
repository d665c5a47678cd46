"""Child process of the hostile-input suite: ingest case folders, one JSON line each.

Run as ``python -m tests.factories.hostile_child FOLDER...``. Each case goes through the
path ``radserve run`` takes (discover_series, then load_series on every part) under the
default ingest policy. Per case it prints the outcome (``ok``, ``error`` with the
RadserveError's code and message, or ``crash`` with the traceback), the seconds it took,
the process's peak RSS so far and whether a traceback reached the log. A case running
past ``CASE_LIMIT_S`` is stopped by SIGALRM and reported as ``hang``.
"""

from __future__ import annotations

import io
import json
import logging
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

CASE_LIMIT_S = 120


class _Hang(BaseException):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Hang


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(folders: list[str]) -> None:
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.WARNING)
    from radserve.errors import RadserveError
    from radserve.ingest import discover_series, load_series

    signal.signal(signal.SIGALRM, _alarm)
    print(json.dumps({"baseline_mb": _peak_mb()}), flush=True)
    for folder in folders:
        mark = log.tell()
        start = time.perf_counter()
        signal.alarm(CASE_LIMIT_S)
        outcome: dict[str, object] = {"case": folder, "result": "ok", "errors": []}
        try:
            for header in discover_series(Path(folder)):
                try:
                    load_series(header, workers=1)
                except RadserveError as exc:
                    outcome["errors"].append([exc.code, exc.message])  # type: ignore[union-attr]
        except RadserveError as exc:
            outcome["errors"].append([exc.code, exc.message])  # type: ignore[union-attr]
        except _Hang:
            outcome["result"] = "hang"
        except BaseException:
            outcome["result"] = "crash"
            outcome["traceback"] = traceback.format_exc()
        finally:
            signal.alarm(0)
        if outcome["result"] == "ok" and outcome["errors"]:
            outcome["result"] = "error"
        text = log.getvalue()[mark:]
        outcome["seconds"] = round(time.perf_counter() - start, 3)
        outcome["peak_mb"] = _peak_mb()
        outcome["traceback_logged"] = "Traceback" in text
        print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
