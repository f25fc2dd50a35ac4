"""Named parts in registration order: the gravity kinds and the mass sources.

A :class:`Registry` is also the sequence of its names, so a setting whose choices hold one
(``PruneParams.gravity_kind``, ``gravity_mass``) follows every :meth:`~Registry.register` and
:meth:`~Registry.unregister`: validation, the CLI's ``--gravity-kind`` choices, the app's
select box and the URL read the registry as it stands.

Examples
--------
>>> class Part:
...     name = "a"
>>> reg = Registry("part", Part)
>>> _ = reg.register(Part)
>>> list(reg), "a" in reg, reg
(['a'], True, ('a',))
>>> reg.get("b")
Traceback (most recent call last):
...
ValueError: unknown part 'b'; registered: ('a',)
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar, overload

T = TypeVar("T")

__all__ = ["Registry"]


class Registry(Sequence[str], Generic[T]):
    """Instances of ``base`` by their ``name``; as a sequence, the names in order."""

    def __init__(self, what: str, base: type[T]) -> None:
        self.what = what
        self.base = base
        self._items: dict[str, T] = {}

    # -- the names, as a sequence -----------------------------------------------------------
    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i):
        return tuple(self._items)[i]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._items))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._items

    def __repr__(self) -> str:
        return repr(tuple(self._items))

    # -- the parts ---------------------------------------------------------------------------
    def get(self, name: str) -> T:
        """The part called ``name``; ``ValueError`` naming the registered ones otherwise."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            close = difflib.get_close_matches(str(name), list(self._items), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(
                f"unknown {self.what} {name!r}{hint}; registered: {tuple(self._items)}"
            ) from None

    def register(self, part: T | type[T]) -> T | type[T]:
        """Add ``part`` (an instance, or a class to instantiate) under its ``name``.

        Returns ``part``, so it works as a class decorator.
        """
        inst = part() if isinstance(part, type) else part
        if not isinstance(inst, self.base):
            raise TypeError(f"a {self.what} must be a {self.base.__name__}, got {inst!r}")
        name = getattr(inst, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.what} needs a non-empty str name, got {name!r}")
        if name in self._items:
            raise ValueError(f"a {self.what} named {name!r} is already registered")
        self._items[name] = inst
        return part

    def unregister(self, name: str) -> None:
        """Remove the part called ``name``."""
        self.get(name)
        del self._items[name]
