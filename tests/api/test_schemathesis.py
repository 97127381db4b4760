"""API fuzzing: schemathesis against the OpenAPI document a live metasrv serves.

Every operation gets generated valid and invalid requests (bounded: a few dozen examples
each, well under two minutes in all). No response may be a 5xx, and every response must
match the status codes, content types and schemas the document declares.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.api._live import (
    DATANODE_TOKEN,
    OPERATOR_TOKEN,
    LiveMetasrv,
    live_metasrv,
)

_VALID_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
EXAMPLES = 20
"""Examples per operation and generation mode (valid, invalid)."""
BUDGET_S = 150.0
"""The whole fuzzing run must stay under this."""
EXCLUDED_CHECKS = [positive_data_acceptance]
"""JSON Schema counts 820.0 as an integer, but the API takes ids and counters only as JSON
integers (strict models, strict heartbeat parser): such a request gets a 422 by design.
Every other check runs: no 5xx, declared statuses, content types and response schemas,
invalid data rejected."""


@pytest.fixture(scope="module")
def target(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveMetasrv]:
    workdir = tmp_path_factory.mktemp("schemathesis")
    with live_metasrv(kafka_bootstrap, etcd_endpoint, workdir) as metasrv:
        yield metasrv


def _confine(case: Any, target: LiveMetasrv) -> None:
    """Keep registrations on this test's own pool topics: a generated valid topic name
    would otherwise create a stray Kafka topic on the shared broker."""
    body = case.body
    if (
        case.method.upper() == "POST"
        and case.path == "/v1/regions"
        and isinstance(body, dict)
        and isinstance(body.get("topic"), str)
        and _VALID_TOPIC.match(body["topic"])
    ):
        body["topic"] = f"{target.prefix}_{len(body['topic']) % 3}"


def _fuzz(operation: Any, mode: GenerationMode, target: LiveMetasrv) -> None:
    token = DATANODE_TOKEN if operation.path == "/v1/heartbeat" else OPERATOR_TOKEN

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        # No shrinking: the first failing example is reported as is, within the budget.
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        _confine(case, target)
        case.call_and_validate(
            headers={"Authorization": f"Bearer {token}"}, excluded_checks=EXCLUDED_CHECKS
        )

    run()


def test_no_5xx_and_responses_match_the_schema(target: LiveMetasrv) -> None:
    schema = schemathesis.openapi.from_url(f"{target.url}/openapi.json")
    # Unknown query parameters are ignored (as HTTP APIs commonly do), not rejected; and
    # the bearer token is ours to send: the auth matrix is tested in test_purge_routes.
    schema.config.generation.update(allow_extra_parameters=False, with_security_parameters=False)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    labels = {f"{op.method.upper()} {op.path}" for op in operations}
    # The operator surface this suite exists for must be in the document.
    assert {
        "POST /v1/purge",
        "GET /v1/purge/history",
        "GET /v1/procedures",
        "GET /v1/procedures/{procedure_id}",
        "POST /v1/procedures/{procedure_id}/cancel",
        "GET /v1/events",
        "POST /v1/heartbeat",
        "POST /v1/regions",
    } <= labels, sorted(labels)
    failures: list[str] = []
    started = time.monotonic()
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(operation, mode, target)
            except Unsatisfiable:
                # Nothing to make invalid (no parameters, no body): nothing to test.
                continue
            except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup
                label = f"{operation.method.upper()} {operation.path} [{mode.value}]"
                failures.append(f"{label}: {exc}")
    elapsed = time.monotonic() - started
    assert not failures, "\n\n".join(failures)
    assert elapsed < BUDGET_S, f"fuzzing took {elapsed:.0f}s, budget {BUDGET_S}s"
