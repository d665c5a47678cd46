"""Validate FHIR Bundles (JSON files) against FHIR R4 4.0.1 structures.

Runs in a separate virtual environment (``.venv-fhir-r4``, made by ``.ci/run``):
fhir.resources 6.4 is the last release with R4 4.0.1 models, and it needs pydantic 1,
so it cannot live beside radserve's fhir.resources 8 (R5 + R4B) and pydantic 2.

    .venv-fhir-r4/bin/python tools/fhir_r4_validate.py bundle.json [...]

Prints one line per file: "ok" or the locations and error types (never values: they
may be patient data). Exit status 1 if any file fails, 2 if the models are not R4 4.0.1.
"""

from __future__ import annotations

import json
import sys

import fhir.resources
from fhir.resources.bundle import Bundle
from pydantic import ValidationError

EXPECTED = "4.0.1"


def main(paths: list[str]) -> int:
    if fhir.resources.__fhir_version__ != EXPECTED:
        print(
            f"fhir.resources {fhir.resources.__version__} has FHIR "
            f"{fhir.resources.__fhir_version__}, not {EXPECTED}"
        )
        return 2
    failed = 0
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        try:
            Bundle.parse_obj(data)
        except ValidationError as exc:
            failed += 1
            where = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['type']}" for e in exc.errors()[:10]
            )
            print(f"{path}: {where}")
        else:
            print(f"{path}: ok (FHIR {EXPECTED})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
