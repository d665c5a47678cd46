"""schemathesis against the live server's OpenAPI document: every operation, with a real
API key of each role (and none), asserting no 500 and responses that conform to the
schema (status codes, content types, headers, bodies).

Short by default (a bounded, derandomised set of examples per operation: a minute or two
on 2 cores); ``RADSERVE_TEST_FUZZ_HTTP=long`` runs many more, randomised, for a nightly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from tests.factories.service import live_server, settings_for

LONG = os.environ.get("RADSERVE_TEST_FUZZ_HTTP", "").lower() == "long"
EXAMPLES = 250 if LONG else 12
ROLES = ("read", "submit", "admin")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


BOUNDARY = "fuzz-boundary-7f3a"
STOW_TYPE = f'multipart/related; type="application/dicom"; boundary={BOUNDARY}'


@schemathesis.serializer("multipart/related")
def _one_part(ctx: Any, value: Any) -> bytes:
    """STOW-RS bodies: the generated value as the one part of a multipart/related body
    (framing is what the hand-written malformed requests vary)."""
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
    else:
        data = json.dumps(value, default=str).encode()
    head = f"--{BOUNDARY}\r\nContent-Type: application/dicom\r\n\r\n".encode()
    return head + data + f"\r\n--{BOUNDARY}--\r\n".encode()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with live_server(settings_for(tmp_path_factory.mktemp("fuzz-http")), roles=ROLES) as live:
        yield live


@pytest.fixture(scope="module")
def api_schema(live: dict[str, Any]) -> Any:
    return schemathesis.openapi.from_url(
        f"{live['url']}/openapi.json",
        headers={"Authorization": f"Bearer {live['keys']['read']}"},
    )


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_operation_with_every_credential(
    api_schema: Any, live: dict[str, Any], mode: GenerationMode
) -> None:
    """Each operation: schema-valid (positive) or schema-violating (negative) requests,
    sent with each role's key and with none. (A loop, not schemathesis's pytest plugin,
    which does not load under pytest 9.)"""
    failures: dict[str, str] = {}
    unsatisfiable: list[str] = []
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 20
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=not LONG,
            database=None,
            phases=[Phase.explicit, Phase.generate] + ([Phase.shrink] if LONG else []),
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            for role in (*ROLES, None):
                headers = {"Authorization": f"Bearer {live['keys'][role]}"} if role else {}
                if case.media_type and case.media_type.startswith("multipart/related"):
                    headers["Content-Type"] = STOW_TYPE
                case.call_and_validate(
                    base_url=live["url"], headers=headers, checks=CHECKS, timeout=60
                )

        try:
            run()
        except Unsatisfiable:  # nothing to generate (negative mode: nothing to get wrong)
            unsatisfiable.append(operation.label)
        except (Exception, BaseExceptionGroup) as exc:  # report every operation, not the first
            failures[operation.label] = f"{type(exc).__name__}: {exc}"[:3000]
    print(mode, "nothing to generate for", unsatisfiable)
    report = "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())
    assert not failures, f"{len(failures)} operations failed: {sorted(failures)}\n\n{report}"
