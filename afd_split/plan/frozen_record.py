"""Frozen records stored in a tuple: the plan's data types at the cost of one allocation.

A plan is built on every prefill step. As frozen dataclasses its three objects
(the plan and two ubatches) were more than half of a small batch's planning
time: each needs an object, an instance dict and a field-by-field fill. A
tuple subclass holds the same fields in one allocation, and a named property
per field reads them back. Records keep what the frozen dataclasses gave:
keyword construction with defaults, read-only fields, identity equality
(``eq=False``), a field-naming repr, ``replace`` and pickling; they add no
tuple arithmetic and no ordering. What stays a tuple's: ``len``, iteration,
indexing, ``json`` writing one as a list; and a tuple takes no weak reference
(the soak's ``lifetime_ref`` uses a probe in the instance dict instead).
Pickles and copies leave the per-instance caches behind (recomputed on read).
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from operator import itemgetter
from types import MappingProxyType

_tuple_new = tuple.__new__


class FrozenRecord(tuple):
    """Base of a record: subclasses name their fields in ``__init_subclass__``.

    ``class UBatch(FrozenRecord, fields=("index", ...), defaults={...}, hidden=(...))``
    adds one read-only property per field (``hidden`` fields stay out of the
    repr). Instances keep a ``__dict__`` for ``functools.cached_property``.
    Trusted builders call ``tuple.__new__(cls, values)`` with every field in order.
    """

    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _defaults: MappingProxyType = MappingProxyType({})
    _repr_fields: tuple[str, ...] = ()

    def __init_subclass__(cls, *, fields=None, defaults=None, hidden=(), **kwargs):
        super().__init_subclass__(**kwargs)
        if fields is None:  # a plain subclass of a record keeps its parent's fields
            return
        cls._fields = tuple(fields)
        cls._defaults = MappingProxyType(dict(defaults or {}))
        cls._repr_fields = tuple(name for name in cls._fields if name not in hidden)
        for index, name in enumerate(cls._fields):
            if name not in cls.__dict__:  # a subclass may define its own reader
                setattr(cls, name, property(itemgetter(index), doc=f"Field {name!r}."))

    def __new__(cls, *args, **kwargs):
        fields = cls._fields
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__}() takes {len(fields)} fields, got {len(args)}")
        values = list(args)
        for name in fields[len(args):]:
            if name in kwargs:
                values.append(kwargs.pop(name))
            elif name in cls._defaults:
                values.append(cls._defaults[name])
            else:
                raise TypeError(f"{cls.__name__}() is missing field {name!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}() got unknown fields {sorted(kwargs)}")
        return _tuple_new(cls, values)

    def replace(self, **changes) -> FrozenRecord:
        """A copy with ``changes`` (like ``dataclasses.replace``); the copy's caches are empty."""
        unknown = set(changes) - set(self._fields)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no fields {sorted(unknown)}")
        values = [changes.get(name, value) for name, value in zip(self._fields, self, strict=True)]
        return _tuple_new(type(self), values)

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field {name!r} of {type(self).__name__}")

    def __delattr__(self, name):
        raise FrozenInstanceError(f"cannot delete field {name!r} of {type(self).__name__}")

    def __reduce__(self):
        return type(self), tuple(self)

    def __repr__(self) -> str:
        named = zip(self._fields, self, strict=True)
        shown = ", ".join(f"{name}={value!r}" for name, value in named if name in self._repr_fields)
        return f"{type(self).__name__}({shown})"

    # Identity equality, as the frozen dataclasses had (eq=False): records hold arrays.
    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def _unordered(self, other):
        return NotImplemented

    __lt__ = __le__ = __gt__ = __ge__ = _unordered

    def _no_arithmetic(self, other):
        return NotImplemented

    __add__ = __radd__ = __mul__ = __rmul__ = _no_arithmetic
