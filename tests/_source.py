"""Modules parsed once per test session, for the tests that read the code's own shape."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the module at `path`, in `ast.walk` order."""
    return tuple(ast.walk(ast.parse(path.read_text(), filename=str(path))))
