"""Options several commands share, declared once.

`shared_options(options, into=..., build=...)` adds the `options` (name, typer
annotation) to a command's signature and calls the command with one argument, `into`,
built from them: the operator commands get a `client` from `--url/--token/--config`,
the stack commands a `cfg` from the port options.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

Command = Callable[..., None]


def shared_options(
    options: Sequence[tuple[str, Any]],
    *,
    into: str,
    build: Callable[..., AbstractContextManager[Any]],
) -> Callable[[Command], Command]:
    """Decorate a command taking `into` (keyword-only) so that it takes `options` instead;
    `build(**their values)` is a context manager giving the value of `into`."""

    def wrap(command: Command) -> Command:
        own = inspect.signature(command)
        # Annotations are strings here (postponed evaluation); `into`'s type may be
        # imported for type checking only, so only the others are evaluated.
        params = [
            p.replace(annotation=eval(p.annotation, command.__globals__))
            if isinstance(p.annotation, str)
            else p
            for p in own.parameters.values()
            if p.name != into
        ]
        params += [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
            for name, kind in options
        ]
        names = [name for name, _ in options]

        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> None:
            shared = {name: kwargs.pop(name, None) for name in names}
            with build(**shared) as value:
                command(*args, **{into: value}, **kwargs)

        run.__signature__ = own.replace(parameters=params, return_annotation=None)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return wrap
