"""Run a callback right after a named module is first imported, without importing it ourselves.

The agent must never import torch (or swift, vLLM, DeepSpeed) into a process that does not; a
meta-path finder watches for the module and calls back once its body has executed.
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False   # not typing's: the agent does not import typing (start-up cost)
if TYPE_CHECKING:
    import importlib.machinery
    import types
    from typing import Callable, Sequence

    Callback = Callable[[types.ModuleType], None]


class _PostImportFinder:
    """A meta-path finder (the protocol only: importlib.abc costs milliseconds per process)."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[Callback]] = {}
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.hooks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, self.hooks.pop(fullname))
        return spec


class _HookedLoader:
    def __init__(self, loader: object, callbacks: list[Callback]) -> None:
        self._loader = loader
        self._callbacks = callbacks

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[attr-defined]

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)  # type: ignore[attr-defined]
        for callback in self._callbacks:
            callback(module)

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)


_FINDER = _PostImportFinder()


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``name`` is imported (at once if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    _FINDER.hooks.setdefault(name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
