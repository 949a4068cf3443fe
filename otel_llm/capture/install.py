"""Patch each HTTP stack when the application imports it; remove every patch on ``deactivate``.

Nothing here imports an HTTP library: a stack (``shared.Stack``) is patched once all of its
modules are imported, by a wrapt post-import hook on each of them, or at ``activate`` when they
already are. wrapt cannot unregister a hook, so each module's hook is registered once per process
and patches only while a session is active; between sessions a hook that fires does nothing, and
the next ``activate`` patches what was imported meanwhile.

Locking. A hook runs inside the application's import, holding that module's import lock, and
then takes ``_lock``; so code holding ``_lock`` never imports (it would deadlock with a thread
importing that module) and reads modules from ``sys.modules`` only. A hook never raises into the
application's import: a failure is logged once and that stack stays unpatched.
"""

from __future__ import annotations

import importlib
import sys
import threading
from types import ModuleType
from typing import Any, Iterator

from wrapt import register_post_import_hook, wrap_function_wrapper

from otel_llm._log import log_once, logger
from otel_llm.capture import aiohttp, httpcore, urllib3
from otel_llm.capture.call import end_open_calls
from otel_llm.capture.shared import ClassAttribute, Patch, SinkGetter, Stack, flush_collected

__all__ = ["STACKS", "activate", "deactivate", "end_calls", "patched_stacks"]

STACKS: tuple[Stack, ...] = (*httpcore.STACKS, *aiohttp.STACKS, *urllib3.STACKS)
# module name -> the stacks whose patching its import may complete
_BY_MODULE: dict[str, list[Stack]] = {}
for _stack in STACKS:
    for _name in _stack.modules:
        _BY_MODULE.setdefault(_name, []).append(_stack)

_MISSING = object()

_lock = threading.Lock()
_sink: SinkGetter | None = None  # None: not instrumented, hooks do nothing
_installed: set[str] = set()  # names of the stacks patched in this session
_patched: list[tuple[Any, str]] = []  # (owner, method) wrapped with wrapt
_replaced: list[tuple[Any, str, Any]] = []  # (owner, attribute, previous value or _MISSING)

_register_lock = threading.Lock()
_registered = False
_registering = threading.local()  # set while wrapt runs a hook at registration: not an import


def _importing(module: ModuleType) -> bool:
    """The module is still executing (in sys.modules, not finished yet)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _on_import(module: ModuleType) -> None:
    """wrapt post-import hook: patch the stacks this import completes. Never raises."""
    if getattr(_registering, "active", False):
        return  # activate() patches what is already imported itself
    try:
        name = module.__name__
        for stack in _BY_MODULE.get(name, ()):
            _install_stack(stack, just_imported=name)
    except Exception:
        log_once("patching an HTTP library failed")


def _install_stack(stack: Stack, just_imported: str | None) -> None:
    """Patch ``stack`` if a session is active, it is not patched yet and all its modules are
    imported (``just_imported`` finished executing even though importlib still marks it)."""
    with _lock:
        if _sink is None or stack.name in _installed:
            return
        for name in stack.modules:
            module = sys.modules.get(name)
            if module is None or (name != just_imported and _importing(module)):
                return  # the hook of the module still missing completes it
        _installed.add(stack.name)  # even if a patch fails below: never retried, never twice
        try:
            for patch in stack.patches(_sink):
                _install(patch)
        except Exception:
            log_once(f"patching {stack.name} failed; its calls are not traced")
            return
    logger.debug("otel_llm: %s patched", stack.name)


def _install(patch: Patch | ClassAttribute) -> None:
    """Install one hook; one whose library, class or method is missing (another version of
    the library) is skipped: that stack is then traced with less detail, never broken."""
    if patch.module is None:
        return
    owner_name, _, name = patch.target.rpartition(".")
    owner = getattr(patch.module, owner_name, None) if owner_name else patch.module
    if owner is None or (isinstance(patch, Patch) and not hasattr(owner, name)):
        logger.debug("otel_llm: %s.%s not found, not hooked", patch.module.__name__, patch.target)
        return
    if isinstance(patch, ClassAttribute):
        _replaced.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, patch.value)
        return
    _patched.append((owner, name))
    patch.wrapper._otel_llm_hook = True  # type: ignore[attr-defined]
    wrap_function_wrapper(patch.module, patch.target, patch.wrapper)


def _register_hooks() -> None:
    """One wrapt hook per module name, once per process."""
    global _registered
    with _register_lock:
        if _registered:
            return
        _registered = True
        _registering.active = True
        try:
            for name in _BY_MODULE:
                register_post_import_hook(_on_import, name)
        finally:
            _registering.active = False


def _wait_for_import(name: str) -> None:
    """Wait until another thread's import of ``name`` is done (importlib's module lock): a hook
    registered after that import began would never fire for it."""
    try:
        importlib.import_module(name)
    except Exception:  # its importer sees the error; the stack simply stays unpatched
        pass


def activate(get_sink: SinkGetter) -> None:
    """Start patching: the stacks already imported now, the others as the application imports them."""
    global _sink
    with _lock:
        _sink = get_sink
    _register_hooks()
    for stack in STACKS:
        for name in stack.modules:
            module = sys.modules.get(name)
            if module is not None and _importing(module):
                _wait_for_import(name)  # outside _lock: that import's own hooks take it
        _install_stack(stack, just_imported=None)


def deactivate() -> None:
    """Remove every patch; hooks that fire later do nothing."""
    global _sink
    with _lock:
        _sink = None
        for owner, method in _patched:
            _remove_layer(owner, method)
        _patched.clear()
        for owner, name, previous in reversed(_replaced):
            if previous is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, previous)
        _replaced.clear()
        _installed.clear()


def end_calls(timeout: float = 1.0) -> int:
    """End every call still open (at process exit), so that its spans are exported too: first the
    ones whose response was garbage-collected (queued for the reaper, waited for up to
    ``timeout`` seconds), then the others. Returns how many were still open."""
    flush_collected(timeout)
    return end_open_calls()


def patched_stacks() -> frozenset[str]:
    """The stacks patched in this session (tests, diagnostics)."""
    with _lock:
        return frozenset(_installed)


def _is_ours(layer: Any) -> bool:
    return bool(getattr(getattr(layer, "_self_wrapper", None), "_otel_llm_hook", False))


def _layers(owner: Any, method: str) -> Iterator[Any]:
    """The wrapt layers on ``owner.method``, outermost first."""
    layer = owner.__dict__.get(method)
    while layer is not None and hasattr(layer, "_self_wrapper"):
        yield layer
        layer = getattr(layer, "__wrapped__", None)


def _remove_layer(owner: Any, method: str) -> None:
    """Take otel_llm's wrapper out of ``owner.method``, leaving layers added after it in place
    (e.g. opentelemetry-instrumentation-httpx when both were loaded by opentelemetry-instrument)."""
    above: Any = None
    for layer in _layers(owner, method):
        if _is_ours(layer):
            if above is None:
                setattr(owner, method, layer.__wrapped__)
            else:
                above.__wrapped__ = layer.__wrapped__
            return
        above = layer
