"""API fuzzing: schemathesis against the OpenAPI document a live metasrv serves.

Every operation gets generated valid and invalid requests (bounded: a few dozen examples
each, well under two minutes in all). No response may be a 5xx, every response must
match the status codes, content types and schemas the document declares, and valid
requests must be accepted (positive data acceptance). A second, shorter pass sends no
token of ours and lets schemathesis generate the Authorization header: no generated
credential may be admitted to an endpoint that needs one.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from metasrv.model import ID_MAX
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
AUTH_EXAMPLES = 8
"""Examples per operation and mode in the generated-credentials pass."""
UNDOCUMENTED_BOUNDS = {"/v1/heartbeat"}
"""Operations whose body has a rule JSON Schema cannot state: a heartbeat names each
region at most once (a repeated region_id is a 422). Positive data acceptance is off for
these only."""
OPEN_PATHS = {"/healthz", "/readyz", "/dashboard", "/openapi.json"}
"""Endpoints that need no token (DESIGN §5)."""


_EXACT_FLOAT_INTS = 1 << 53


def _json_integers(value: Any) -> Any:
    """JSON Schema counts 820.0 as an integer, but the API takes ids and counters only as
    JSON integers (strict models, strict heartbeat parser), so a generated whole float is
    sent as the integer it stands for; with that, valid data must be accepted."""
    if isinstance(value, float) and value.is_integer():
        # Past 2^53 a float is not the integer the generator meant (9223372036854775807
        # becomes 2^63, over the maximum): such an example is skipped, not sent.
        assume(abs(value) <= _EXACT_FLOAT_INTS)
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        # The generator reads the documented maximum 2^63-1 through a float and may
        # produce 9223372036854776000, over it: not valid data, so not sent either.
        assume(value <= ID_MAX)
        return value
    if isinstance(value, dict):
        return {k: _json_integers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_integers(v) for v in value]
    return value


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
    if isinstance(case.body, dict | list):
        case.body = _json_integers(case.body)
    body = case.body
    if (
        case.method.upper() == "POST"
        and case.path == "/v1/regions"
        and isinstance(body, dict)
        and isinstance(body.get("topic"), str)
        and _VALID_TOPIC.match(body["topic"])
    ):
        body["topic"] = f"{target.prefix}_{len(body['topic']) % 3}"


def _fuzz(
    operation: Any, mode: GenerationMode, target: LiveMetasrv, *, our_token: bool = True
) -> None:
    token = DATANODE_TOKEN if operation.path == "/v1/heartbeat" else OPERATOR_TOKEN
    headers = {"Authorization": f"Bearer {token}"} if our_token else None

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES if our_token else AUTH_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        # No shrinking: the first failing example is reported as is, within the budget.
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        _confine(case, target)
        excluded = [positive_data_acceptance] if operation.path in UNDOCUMENTED_BOUNDS else []
        response = case.call_and_validate(headers=headers, excluded_checks=excluded)
        if not our_token and operation.path not in OPEN_PATHS:
            sent = (case.headers or {}).get("Authorization")
            # Refused, whatever the reason (401/403, or 4xx for a body checked first).
            assert 400 <= response.status_code < 500, (sent, response.status_code)

    run()


def _operations(target: LiveMetasrv, *, generated_auth: bool) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{target.url}/openapi.json")
    # Unknown query parameters are ignored (as HTTP APIs commonly do), not rejected.
    schema.config.generation.update(
        allow_extra_parameters=False, with_security_parameters=generated_auth
    )
    # A URL over `http.url_limit` is refused with 414 (documented): invalid data rejected.
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "414"]
    return [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]


def test_no_5xx_and_responses_match_the_schema(target: LiveMetasrv) -> None:
    operations = _operations(target, generated_auth=False)
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


def test_generated_credentials_are_never_admitted(target: LiveMetasrv) -> None:
    failures: list[str] = []
    started = time.monotonic()
    for operation in _operations(target, generated_auth=True):
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(operation, mode, target, our_token=False)
            except Unsatisfiable:
                continue
            except (Exception, BaseExceptionGroup) as exc:
                label = f"{operation.method.upper()} {operation.path} [{mode.value}]"
                failures.append(f"{label}: {exc}")
    assert not failures, "\n\n".join(failures)
    assert time.monotonic() - started < BUDGET_S
