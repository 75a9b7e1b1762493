"""The base of the typed request headers: a msgspec Struct per request code, one set of rules.

A request's header is the frame's msgpack map of named fields (frame.py). A :class:`Header`
subclass declares those fields once, with their types, defaults and limits
(``Annotated[int, Meta(ge=0, le=...)]``), for both sides: a client builds the frame with
``XRequest(...).frame(body)``; a server reads it with ``XRequest.decode(frame)``, which raises
:class:`~orbitmq.protocol.fields.FieldError` (MESSAGE_ILLEGAL) naming the first bad field, in
declaration order, with the remark ``orbitmq.protocol.fields.get_int`` / ``get_str`` give.

The wire rules are those of the ``get_*`` readers, kept exactly:

- a field that is absent or nil takes its default; without a default it is required;
- an ``int`` is a msgpack integer (not a bool) within its limits (inclusive bounds in the remark);
  every int field states its bounds, within int64 (``limits.I64`` for "any");
- a ``str`` is a string, of ``min_length``..``max_length`` characters when the type says so;
- ``bool`` is a bool, ``list[str]`` a list of strings, ``Any`` passes through unchecked (the
  handler checks it, e.g. a receipt handle, which has its own error codes);
- a ``Meta(extra={"check": fn})`` adds ``fn(name, value)``, which raises FieldError;
- fields the class does not know are ignored (writers add fields, readers ignore them).

``to_header()`` writes the required fields and every other field whose value is not its default
(None included): absent and default mean the same to every reader, so the header is as small as
the hand-built dicts were. Constructing a header does not validate: a client may send what a
server must refuse (tests do), and the server decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import msgspec
import msgspec.inspect as mi

from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.fields import FieldError
from orbitmq.protocol.frame import Buffer, Frame

__all__ = ["FieldError", "FieldSpec", "Header", "fields_of"]

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

Check = Callable[[str, Any], None]


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One header field as decode() checks it and the protocol docs describe it."""

    name: str
    kind: str
    """"int", "str", "bool", "list[str]" or "any"."""
    required: bool
    default: Any
    lo: int = I64_MIN
    hi: int = I64_MAX
    min_length: int | None = None
    max_length: int | None = None
    check: Check | None = None
    doc: str = ""

    def read(self, fields: dict[str, Any]) -> Any:
        value = fields.get(self.name)
        if value is None:
            if self.required:
                raise FieldError(f"field {self.name!r} is required")
            return self.default
        kind = self.kind
        if kind == "int":
            if not isinstance(value, int) or isinstance(value, bool):
                raise FieldError(
                    f"field {self.name!r} must be an integer, not {type(value).__name__}"
                )
            if not self.lo <= value <= self.hi:
                raise FieldError(f"field {self.name!r} = {value} is outside [{self.lo}, {self.hi}]")
        elif kind == "str":
            if not isinstance(value, str):
                raise FieldError(
                    f"field {self.name!r} must be a string, not {type(value).__name__}"
                )
            lo = self.min_length or 0
            hi = self.max_length
            if len(value) < lo or (hi is not None and len(value) > hi):
                raise FieldError(f"field {self.name!r} must be {lo} to {hi} characters")
        elif kind == "bool":
            if not isinstance(value, bool):
                raise FieldError(
                    f"field {self.name!r} must be a boolean, not {type(value).__name__}"
                )
        elif kind == "list[str]" and (
            not isinstance(value, list) or not all(isinstance(v, str) for v in value)
        ):
            raise FieldError(f"field {self.name!r} must be a list of strings")
        if self.check is not None:
            self.check(self.name, value)
        return value


def _spec(field: mi.Field) -> FieldSpec:
    t: mi.Type = field.type
    if isinstance(t, mi.UnionType):  # X | None: the None is "absent", not a type of its own
        (t,) = (u for u in t.types if not isinstance(u, mi.NoneType))
    check: Check | None = None
    doc = ""
    if isinstance(t, mi.Metadata):
        check = (t.extra or {}).get("check")
        doc = (t.extra_json_schema or {}).get("description", "")
        t = t.type
    default = None if field.default is msgspec.NODEFAULT else field.default
    base = FieldSpec(field.name, "any", field.required, default, check=check, doc=doc)
    if isinstance(t, mi.IntType):
        lo = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else None)
        hi = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else None)
        if lo is None or hi is None or lo < I64_MIN or hi > I64_MAX:
            # msgspec would take a uint64 above 2^63-1 where the get_* readers refuse it.
            raise TypeError(f"header field {field.name}: an int states bounds within int64")
        return FieldSpec(base.name, "int", base.required, default, lo, hi, check=check, doc=doc)
    if isinstance(t, mi.StrType):
        return FieldSpec(
            base.name, "str", base.required, default,
            min_length=t.min_length, max_length=t.max_length, check=check, doc=doc,
        )  # fmt: skip
    if isinstance(t, mi.BoolType):
        return FieldSpec(base.name, "bool", base.required, default, check=check, doc=doc)
    if isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StrType):
        return FieldSpec(base.name, "list[str]", base.required, default, check=check, doc=doc)
    if isinstance(t, mi.AnyType):
        return base
    raise TypeError(f"header field {field.name}: unsupported type {t!r}")


@dataclass(frozen=True, slots=True)
class _Plan:
    specs: tuple[FieldSpec, ...]
    lists: tuple[str, ...]
    """Fields msgspec would also fill from a tuple; the wire (and get_str_list) wants a list."""
    checks: tuple[FieldSpec, ...]
    validates: bool
    """The class has rules across fields (overrides Header.validate)."""


_PLANS: dict[type, _Plan] = {}


def _plan(cls: type[Header]) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        specs = tuple(_spec(f) for f in info.fields)
        plan = _PLANS[cls] = _Plan(
            specs,
            tuple(s.name for s in specs if s.kind == "list[str]"),
            tuple(s for s in specs if s.check is not None),
            cls.validate is not Header.validate,
        )
    return plan


def fields_of(cls: type[Header]) -> tuple[FieldSpec, ...]:
    """The field specs of a header class, in declaration order (built once per class)."""
    return _plan(cls).specs


class Header(msgspec.Struct, kw_only=True):
    """A request's header fields. Subclasses set ``code`` and declare the fields."""

    code: ClassVar[RequestCode]
    section: ClassVar[str] = ""
    """The docs/protocol.md table the request is listed in."""
    body: ClassVar[str] = ""
    """What the request's body carries (docs), "" for none."""
    response: ClassVar[str] = ""
    """What the response carries and its error codes (docs)."""
    oneway: ClassVar[bool] = False
    """Sent by a broker to a client, oneway (the client does not answer)."""

    def to_header(self) -> dict[str, Any]:
        """The frame's field map: required fields and those not at their default, in order."""
        out: dict[str, Any] = {}
        for spec in fields_of(type(self)):
            value = getattr(self, spec.name)
            if value is not None and (spec.required or value != spec.default):
                out[spec.name] = value
        return out

    def frame(self, body: Buffer = b"", *, opaque: int = 0, flags: int = 0) -> Frame:
        """The request frame carrying this header (and ``body``)."""
        return Frame(self.code, opaque, flags, self.to_header(), body)

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Self:
        """Check ``fields`` as decode() does; FieldError names the first bad field."""
        plan = _plan(cls)
        # The fast path: msgspec checks types and bounds in C, and agrees with the rules above
        # on every header it accepts (ints are bounded within int64, bools are not ints, absent
        # fields take their defaults). Anything it refuses, a nil included, takes the slow
        # path, which accepts what the rules accept and words the error as get_* did.
        if not plan.lists or all(
            type(fields.get(name, [])) is list or fields[name] is None for name in plan.lists
        ):
            try:
                header = msgspec.convert(fields, cls)
            except msgspec.ValidationError:
                pass
            else:
                for spec in plan.checks:
                    value = getattr(header, spec.name)
                    if value is not None:
                        assert spec.check is not None
                        spec.check(spec.name, value)
                return header
        return cls(**{spec.name: spec.read(fields) for spec in plan.specs})

    @classmethod
    def decode(cls, frame: Frame) -> Self:
        """The header of ``frame``, checked; FieldError (MESSAGE_ILLEGAL) names what is wrong."""
        header = cls.from_fields(frame.fields)
        if _plan(cls).validates:
            header.validate(frame)
        return header

    def validate(self, frame: Frame) -> None:
        """Rules across fields (one field required only with another), run by decode();
        raises FieldError. None by default."""
