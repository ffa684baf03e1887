"""A user's function named in the config as ``module:function`` (``reward.fn``, ``workflow``,
``workflow.agent``): ``load_callable`` imports it, or raises one ValueError that names the config
key, what is wrong (the form, the module, the attribute) and the fix."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from functools import lru_cache


@lru_cache(maxsize=32)
def load_callable(spec: str, what: str, signature: str, coroutine: bool = False) -> Callable:
    """The function ``spec`` (``module:function``) names for the config key ``what``.

    ``signature`` is the parameter list (and return) the fix asks the user to define, as
    ``"(completion, problem) -> float"``; ``coroutine`` requires an ``async def``."""
    module_name, sep, name = spec.partition(":")
    define = f"{'async def ' if coroutine else ''}{name or 'my_fn'}{signature}"
    if not sep or not module_name or not name:
        raise ValueError(f"{what}={spec!r}: not an import path; write it as 'my_module:my_fn' and "
                         f"define {define} in my_module.py")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{what}={spec!r}: cannot import module {module_name!r} ({err}); put it "
                         "on PYTHONPATH or install it") from err
    fn = getattr(module, name, None)
    if fn is None:
        raise ValueError(f"{what}={spec!r}: module {module_name!r} has no function {name!r}; "
                         f"define {define} there")
    if not callable(fn):
        raise ValueError(f"{what}={spec!r}: {module_name}.{name} is not a function (its type is "
                         f"{type(fn).__name__}); define {define}")
    if coroutine and not inspect.iscoroutinefunction(fn):
        raise ValueError(f"{what}={spec!r}: {name} must be an async function ({define})")
    return fn
