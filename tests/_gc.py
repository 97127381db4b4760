"""What the garbage collector would walk: the tracked containers an object keeps alive."""

from __future__ import annotations

import gc
import types


def tracked_reachable(root: object) -> int:
    """Tracked objects reachable from `root` (itself included), not following classes,
    modules or functions: what a full collection visits because `root` is alive."""
    seen: set[int] = set()
    stack = [root]
    count = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(
            obj, type | types.ModuleType | types.FunctionType | types.BuiltinFunctionType
        ):
            continue
        seen.add(id(obj))
        count += gc.is_tracked(obj)
        stack.extend(gc.get_referents(obj))
    return count
