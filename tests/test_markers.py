"""The `services` marker (what `make check` leaves out) finds every way a test reaches a service."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import needs_services


def _item(*fixtures: str, **params: object) -> pytest.Item:
    callspec = SimpleNamespace(params=params) if params else None
    item: pytest.Item = SimpleNamespace(fixturenames=list(fixtures), callspec=callspec)  # type: ignore[assignment]
    return item


def test_a_service_fixture_anywhere_in_the_closure_marks_the_test() -> None:
    # kafka_admin asks for kafka_bootstrap: pytest lists the whole closure.
    assert needs_services(_item("tmp_path", "kafka_admin", "kafka_bootstrap"))
    assert needs_services(_item("cluster_stack"))
    assert needs_services(_item("spark"))
    assert not needs_services(_item("tmp_path", "monkeypatch", "unique_prefix"))


def test_a_backend_parameter_that_reaches_a_service_marks_the_test() -> None:
    # kv_store and its kin ask for the endpoint with request.getfixturevalue, per parameter.
    assert needs_services(_item("kv", "kv_store", kv_store="etcd"))
    assert needs_services(_item("store", store="postgresql"))
    assert not needs_services(_item("kv", "kv_store", kv_store="sqlite"))
    assert not needs_services(_item("case", case=3))
