"""Decoding request bodies into wire structs, encoding answers, and their JSON schemas.

A body that does not fit its struct is a `SchemaError` (422 `validation_error`) naming the
first field that is wrong, as `{"loc": ["body", ...], "msg": ...}` in `errors`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final, TypeVar

import msgspec

from metasrv.errors import SchemaError

T = TypeVar("T")

_AT: Final = re.compile(r"^(.*?)(?: - at `\$(.*)`)?$", re.DOTALL)
_STEP: Final = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[\.\.\.\]")
_MISSING: Final = re.compile(r"^Object missing required field `([^`]+)`$")
_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def invalid(message: str, loc: list[Any]) -> SchemaError:
    """A 422 naming the body field at `loc`."""
    return SchemaError(message, details={"errors": [{"loc": ["body", *loc], "msg": message}]})


def refusal(exc: Exception, encoding: str) -> SchemaError:
    """msgspec's reason for refusing a body, as a 422 naming the field."""
    if isinstance(exc, UnicodeDecodeError):
        return invalid(f"the body is not valid UTF-8 ({exc.reason})", [])
    if isinstance(exc, RecursionError):
        return invalid("the body is nested too deeply", [])
    if not isinstance(exc, msgspec.ValidationError):
        return invalid(f"request body is not valid {encoding}: {exc}", [])
    match = _AT.match(str(exc))
    assert match is not None  # the pattern matches any string
    message, path = match.group(1), match.group(2) or ""
    loc: list[Any] = [
        int(index) if index else name for name, index in _STEP.findall(path) if name or index
    ]
    missing = _MISSING.match(message)
    if missing is not None:
        loc.append(missing.group(1))
        message = "field required"
    where = ".".join(str(step) for step in loc)
    return invalid(f"{where}: {message}" if where else message, loc)


def decode(body: bytes, kind: type[T]) -> T:
    """`body` (JSON) as a `kind`, or `SchemaError` naming the first field that is wrong."""
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.json.Decoder(kind)
    try:
        result: T = decoder.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise refusal(exc, "JSON") from None
    return result


encode: Final = msgspec.json.Encoder().encode
"""An answer struct (or any msgspec-encodable value) as JSON bytes."""


def schema_components(kinds: Iterable[type[Any]]) -> dict[str, Any]:
    """OpenAPI `components.schemas` for `kinds` and every struct they contain."""
    _, components = msgspec.json.schema_components(
        list(kinds), ref_template="#/components/schemas/{name}"
    )
    return components


def schema_ref(kind: type[Any]) -> dict[str, str]:
    """An OpenAPI reference to `kind`'s schema (listed by `schema_components`)."""
    return {"$ref": f"#/components/schemas/{kind.__name__}"}
