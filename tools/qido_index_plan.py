"""QIDO-RS without a Study Instance UID: the result-index queries it runs, their
PostgreSQL plans and times, at growing index sizes (synthetic rows, three instances a
study, two studies a patient, study dates over three years).

    RADSERVE_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        PYTHONPATH=src:. python tools/qido_index_plan.py --sizes 1000 10000 30000

Three reads, alternating within each round so load drifts hit all alike: the whole index
(any other search: ``find(None)``), one patient (``PatientID=`` exact: the keyed hash) and
one month (``StudyDate=a-b``). Only the database read; a search then also stats each
row's result file and reads its header once (cached). Runs in a throw-away schema.
"""

from __future__ import annotations

import argparse
import datetime as dt
import secrets
import statistics
import time
from collections.abc import Callable

from sqlalchemy import Engine, text
from tests.factories.postgres import postgres_schema

from radserve.audit.chain import AuditKey
from radserve.store import init_store
from radserve.store.result_match import MatchBounds, PatientKey, date_bounds
from radserve.store.results import ResultIndex, ResultInstanceRecord

SEG = "1.2.840.10008.5.1.4.1.1.66.4"
EXPLICIT = "1.2.840.10008.1.2.1"
DAY0 = dt.date(2024, 1, 1)


def _rows(start: int, end: int, key: PatientKey) -> list[ResultInstanceRecord]:
    def date(study: int) -> str:
        return (DAY0 + dt.timedelta(days=study * 7 % 1095)).strftime("%Y%m%d")

    return [
        ResultInstanceRecord(
            f"1.2.{i}.1",
            f"1.2.{i // 3}",
            f"1.2.{i // 3}.9",
            SEG,
            EXPLICIT,
            f"job-{i // 3}",
            f"/results/{i}.dcm",
            patient_key=key.of(f"P{i // 6}"),
            match_key_id=key.id,
            study_date=date(i // 3),
        )
        for i in range(start, end)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 30000])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    now = dt.datetime.now(dt.UTC)
    with postgres_schema("radserve_qido_plan") as url:
        store = init_store(url)
        index = ResultIndex(store.engine, audit_key=AuditKey(secrets.token_bytes(32)))
        key = index.patient_key
        assert key is not None
        reads: dict[str, Callable[[], int]] = {
            "whole index": lambda: len(index.find(None)),
            "one patient": lambda: len(index.find(None, bounds=MatchBounds(key.of("P7")))),
            "one month": lambda: len(
                index.find(None, bounds=MatchBounds(None, *date_bounds("20250301-20250331")))
            ),
        }
        have = 0
        for size in sorted(args.sizes):
            rows = _rows(have, size, key)
            for start in range(0, len(rows), 2000):
                index.add(rows[start : start + 2000], now=now)
            have = size
            with store.engine.connect() as connection:
                connection.execute(text("ANALYZE result_instances"))
            times: dict[str, list[float]] = {name: [] for name in reads}
            found: dict[str, int] = {}
            for round_ in range(args.rounds):
                names = list(reads) if round_ % 2 == 0 else list(reversed(reads))
                for name in names:
                    began = time.perf_counter()
                    found[name] = reads[name]()
                    times[name].append((time.perf_counter() - began) * 1000)
            print(
                f"{size} rows: "
                + "; ".join(
                    f"{name} {found[name]} rows {statistics.median(t):.1f} ms"
                    for name, t in times.items()
                )
            )
            _plans(store.engine, key)
        store.close()


def _plans(engine: Engine, key: PatientKey) -> None:
    """The first plan line of each bounded read (an index scan, not a Seq Scan)."""
    patient = key.of("P7")
    low, high = date_bounds("20250301-20250331")
    with engine.connect() as connection:
        for name, where in (
            ("one patient", f"patient_key = '{patient}'"),
            ("one month", f"study_date IS NULL OR study_date BETWEEN '{low}' AND '{high}'"),
        ):
            plan = connection.execute(
                text(f"EXPLAIN SELECT * FROM result_instances WHERE {where}")
            ).scalars()
            print(f"  {name}: {next(iter(plan)).strip()}")


if __name__ == "__main__":
    main()
