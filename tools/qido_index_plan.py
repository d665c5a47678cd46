"""QIDO-RS without a Study Instance UID: the result-index query it runs, its PostgreSQL
plan and its time, at growing index sizes (synthetic rows, three instances a study).

    RADSERVE_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        PYTHONPATH=src:. python tools/qido_index_plan.py --sizes 1000 10000 30000

Only the database read (``ResultIndex.find(None)``); a search then also stats every
result file and reads each header once (cached). Runs in a throw-away schema.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

from sqlalchemy import select, text
from tests.factories.postgres import postgres_schema

from radserve.store import init_store
from radserve.store.models import ResultInstance
from radserve.store.results import ResultIndex, ResultInstanceRecord

SEG = "1.2.840.10008.5.1.4.1.1.66.4"
EXPLICIT = "1.2.840.10008.1.2.1"


def _rows(start: int, end: int) -> list[ResultInstanceRecord]:
    return [
        ResultInstanceRecord(
            f"1.2.{i}.1",
            f"1.2.{i // 3}",
            f"1.2.{i // 3}.9",
            SEG,
            EXPLICIT,
            f"job-{i // 3}",
            f"/results/{i}.dcm",
        )
        for i in range(start, end)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 30000])
    args = parser.parse_args()
    now = dt.datetime.now(dt.UTC)
    query = select(ResultInstance).order_by(
        ResultInstance.series_instance_uid, ResultInstance.created, ResultInstance.path
    )
    with postgres_schema("radserve_qido_plan") as url:
        store = init_store(url)
        index = ResultIndex(store.engine)
        have = 0
        for size in sorted(args.sizes):
            rows = _rows(have, size)
            for start in range(0, len(rows), 2000):
                index.add(rows[start : start + 2000], now=now)
            have = size
            with store.engine.connect() as connection:
                connection.execute(text("ANALYZE result_instances"))
                sql = str(query.compile(compile_kwargs={"literal_binds": True}))
                plan = connection.execute(text(f"EXPLAIN {sql}")).scalars().all()
            began = time.perf_counter()
            found = index.find(None)
            seconds = time.perf_counter() - began
            print(
                f"{len(found)} rows: find(None) {seconds * 1000:.0f} ms; "
                + " | ".join(line.strip() for line in plan[:3])
            )
        store.close()


if __name__ == "__main__":
    main()
