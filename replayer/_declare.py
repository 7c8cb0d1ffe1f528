"""Options declared once, as annotated fields of frozen value objects.

An option is a field declared with :func:`option`: its type is the field's
annotation, and its default, bounds, help text, CLI spelling and the verbs
that take it sit beside it. Everything else is generated from that one place:

* **validation**: :class:`Declared.__post_init__` coerces what a caller may
  reasonably pass (an enum's string, an int for a float, a list for a tuple,
  text for anything with a parser) and refuses the rest with an
  :class:`~replayer.errors.OptionError` naming the field and what it wants,
  then runs the class's own cross-field :meth:`Declared.validate`;
* **the CLI's flags** (``replayer.cli.args``) and **the service's job
  options** (:func:`from_values` over JSON), so a default, a bound or a
  choice list cannot disagree between them.

This module imports only the standard library and :mod:`replayer.errors`:
``replayer --help`` reads the declarations without loading any stage.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from replayer.errors import OptionError

_KEY = "replayer.option"


@dataclass(frozen=True, slots=True)
class _Meta:
    help: str
    metavar: str | None
    cli: str | Literal[False] | None
    aliases: tuple[str, ...]
    parse: Callable[[str], Any] | None
    ge: float | None
    gt: float | None
    le: float | None
    lt: float | None
    check: Callable[[Any], str | None] | None
    verbs: frozenset[str] | None
    secret: bool
    required: bool


def option(
    default: Any,
    help: str = "",
    *,
    metavar: str | None = None,
    cli: str | Literal[False] | None = None,
    aliases: tuple[str, ...] = (),
    parse: Callable[[str], Any] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    check: Callable[[Any], str | None] | None = None,
    verbs: Iterable[str] | None = None,
    secret: bool = False,
    required: bool = False,
) -> Any:
    """Declare one option (a dataclass field).

    ``cli`` is the flag's spelling when it is not ``--`` plus the dashed name
    (``--no-NAME`` for a bool defaulting to True); ``False`` keeps the field
    out of the CLI and the service (library only, still validated). ``parse``
    turns text into a value (the CLI's and the service's strings, and a string
    given to the constructor); without it the annotation's type does.
    ``check`` returns a problem (worded after the field name) or None.
    ``verbs`` narrows the class's :attr:`Declared.__verbs__` for this field.
    ``secret`` fields are never shown (repr, run files). A ``required`` option
    defaults to None and refuses to stay None."""
    meta = _Meta(
        help,
        metavar,
        cli,
        aliases,
        parse,
        ge,
        gt,
        le,
        lt,
        check,
        frozenset(verbs) if verbs is not None else None,
        secret,
        required,
    )
    return dataclasses.field(default=default, metadata={_KEY: meta}, repr=not secret)


# -- what a field's annotation accepts ------------------------------------------------------


def _args(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _arms(tp: Any) -> tuple[Any, ...]:
    return _args(tp) if _is_union(tp) else (tp,)


def _is_enum(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


class _Refused(Exception):
    pass


def _coerce(tp: Any, value: Any) -> Any:
    """``value`` as ``tp`` wants it, or :class:`_Refused`."""
    if tp is Any:
        return value
    if tp is type(None):
        if value is None:
            return None
        raise _Refused
    if _is_union(tp):
        for arm in _args(tp):  # exact matches first: 1 stays an int in int | float
            try:
                return _coerce_exact(arm, value)
            except _Refused:
                continue
        for arm in _args(tp):
            try:
                return _coerce(arm, value)
            except _Refused:
                continue
        raise _Refused
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in _args(tp):
            return value
        raise _Refused
    if origin is tuple:
        if not isinstance(value, tuple | list):
            raise _Refused
        items = _args(tp)
        if len(items) == 2 and items[1] is Ellipsis:
            return tuple(_coerce(items[0], v) for v in value)
        if len(items) != len(value):
            raise _Refused
        return tuple(_coerce(t, v) for t, v in zip(items, value, strict=True))
    if origin in (Mapping, dict) or tp in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise _Refused
        kt, vt = _args(tp) or (Any, Any)
        return {_coerce(kt, k): _coerce(vt, v) for k, v in value.items()}
    if _is_enum(tp):
        if isinstance(value, tp):
            return value
        try:
            return tp(value)
        except ValueError:
            raise _Refused from None
    if tp is bool:
        if type(value) is bool:
            return value
        raise _Refused
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Refused
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise _Refused
            return float(value)
        raise _Refused
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Refused
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _Refused
    return value


def _coerce_exact(tp: Any, value: Any) -> Any:
    if tp is float and isinstance(value, int):
        raise _Refused  # let the int arm take it
    return _coerce(tp, value)


def _want(tp: Any) -> str:
    """What ``tp`` wants, for an error message."""
    arms = [a for a in _arms(tp) if a is not type(None)]
    words = []
    for a in arms:
        origin = typing.get_origin(a)
        if _is_enum(a):
            words.append("one of " + ", ".join(str(m.value) for m in a))
        elif origin is Literal:
            words.append(" or ".join(repr(v) for v in _args(a)))
        elif a is bool:
            words.append("true or false")
        elif a is int:
            words.append("an integer")
        elif a is float:
            words.append("a finite number")
        elif a is str:
            words.append("a string")
        elif origin is tuple:
            words.append("a list")
        elif origin in (Mapping, dict) or a in (Mapping, dict):
            words.append("a mapping")
        else:
            words.append(getattr(a, "__name__", str(a)))
    return " or ".join(words)


def _default_parse(tp: Any) -> Callable[[str], Any] | None:
    """Text to value from the annotation alone (None: text is the value)."""
    arms = [a for a in _arms(tp) if a is not type(None)]
    if len(arms) != 1:
        return None
    a = arms[0]
    if a is int:
        return int
    if a is float:
        return float
    if a is bool:
        return parse_bool
    if _is_enum(a):
        enum_type: Callable[[str], Any] = a
        return enum_type
    return None


def parse_bool(text: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``), as a service form sends them."""
    t = text.strip().lower()
    if t in ("true", "1", "yes", "on"):
        return True
    if t in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"want true or false, not {text!r}")


def _number(v: float) -> str:
    return f"{v:g}"


def _bounds_problem(m: _Meta, value: Any) -> str | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    lo = (m.gt, False) if m.gt is not None else (m.ge, True) if m.ge is not None else None
    hi = (m.lt, False) if m.lt is not None else (m.le, True) if m.le is not None else None
    above = lo is None or (value >= lo[0] if lo[1] else value > lo[0])
    below = hi is None or (value <= hi[0] if hi[1] else value < hi[0])
    if above and below:
        return None
    if lo is not None and hi is not None:
        return f"must be between {_number(lo[0])} and {_number(hi[0])}"
    if lo is not None:
        if lo == (0, False):
            return "must be positive"
        if lo == (0, True):
            return "must not be negative"
        return f"must be at least {_number(lo[0])}" if lo[1] else f"must be over {_number(lo[0])}"
    assert hi is not None
    return f"must be at most {_number(hi[0])}" if hi[1] else f"must be under {_number(hi[0])}"


# -- the declared fields of a class ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spec:
    """One declared option, resolved: what generators and validation read."""

    name: str
    type: Any
    default: Any
    meta: _Meta
    owner: type[Declared]

    @property
    def help(self) -> str:
        return self.meta.help

    @property
    def metavar(self) -> str | None:
        return self.meta.metavar

    @property
    def exposed(self) -> bool:
        """Part of the CLI and the service (not a library-only field)."""
        return self.meta.cli is not False

    @property
    def flag(self) -> bool:
        return self.type is bool

    @property
    def negated(self) -> bool:
        """A flag whose presence sets False (``--no-force-stream``)."""
        return self.flag and self.default is True

    @property
    def repeat(self) -> bool:
        """Given several times on the command line (a tuple of values)."""
        tp = [a for a in _arms(self.type) if a is not type(None)]
        return (
            len(tp) == 1
            and typing.get_origin(tp[0]) is tuple
            and _args(tp[0])[1:] == (Ellipsis,)
            and self.meta.parse is None
        )

    @property
    def spelling(self) -> str:
        if isinstance(self.meta.cli, str):
            return self.meta.cli
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.negated else f"--{dashed}"

    @property
    def choices(self) -> tuple[str, ...] | None:
        arms = [a for a in _arms(self.type) if a is not type(None)]
        if len(arms) == 1 and _is_enum(arms[0]):
            return tuple(str(m.value) for m in arms[0])
        return None

    @property
    def verbs(self) -> frozenset[str]:
        return self.meta.verbs if self.meta.verbs is not None else self.owner.__verbs__

    def parser(self) -> Callable[[str], Any] | None:
        """Text to value (None: the text is the value)."""
        if self.meta.parse is not None:
            return self.meta.parse
        if self.repeat:
            return _default_parse(_args(self.type)[0]) if _args(self.type) else None
        return _default_parse(self.type)

    def parse(self, text: str) -> Any:
        """One text as this option's value, or :class:`OptionError`."""
        conv = self.parser()
        if conv is None:
            return text
        try:
            return conv(text)
        except ValueError as exc:
            if _is_enum(conv) or conv in (int, float):
                raise OptionError(self.name, f"{text!r}: want {_want(self.type)}") from None
            raise OptionError(self.name, str(exc)) from None

    def coerce(self, value: Any) -> Any:
        """``value`` checked and converted as the field takes it (see the module doc)."""
        if value is None and self.meta.required:
            raise OptionError(self.name, "is required")
        if (
            isinstance(value, str)
            and self.meta.parse is not None
            or isinstance(value, str)
            and self.type is not str
            and not _accepts_str(self.type)
        ):
            value = self.parse(value)
        elif self.repeat and isinstance(value, list | tuple):
            conv = self.parser()
            if conv is not None:
                value = tuple(self.parse(v) if isinstance(v, str) else v for v in value)
        try:
            value = _coerce(self.type, value)
        except _Refused:
            raise OptionError(self.name, f"{value!r}: want {_want(self.type)}") from None
        problem = _bounds_problem(self.meta, value)
        if problem is None and self.meta.check is not None and value is not None:
            problem = self.meta.check(value)
        if problem is not None:
            raise OptionError(self.name, problem)
        return value


def _accepts_str(tp: Any) -> bool:
    """Whether a plain string is one of the annotation's own values (``str``,
    or a union holding ``str``, or a string literal)."""
    for a in _arms(tp):
        if a is str:
            return True
        if typing.get_origin(a) is Literal and any(isinstance(v, str) for v in _args(a)):
            return False
    return False


_SPECS: dict[type, tuple[Spec, ...]] = {}


def specs(cls: type[Declared]) -> tuple[Spec, ...]:
    """Every declared field of ``cls``, in declaration order."""
    got = _SPECS.get(cls)
    if got is None:
        hints = typing.get_type_hints(cls, include_extras=False)
        out = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            meta = f.metadata.get(_KEY)
            if meta is None:
                raise TypeError(f"{cls.__name__}.{f.name} is not declared with option()")
            if f.default is dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{f.name}: an option needs a default")
            out.append(Spec(f.name, hints[f.name], f.default, meta, cls))
        got = _SPECS[cls] = tuple(out)
    return got


class Declared:
    """Base of a value object whose fields are all :func:`option` declarations.

    Subclasses are ``@dataclass(frozen=True)``; construction validates every
    field (and :meth:`validate`), so a bad value never reaches the code that
    uses it."""

    __group__: ClassVar[str] = ""
    """The CLI's help-group title for these options."""
    __verbs__: ClassVar[frozenset[str]] = frozenset()
    """The verbs (CLI commands, service job kinds) that take these options."""

    def __post_init__(self) -> None:
        for s in specs(type(self)):
            value = getattr(self, s.name)
            new = s.coerce(value)
            if new is not value:
                object.__setattr__(self, s.name, new)
        self.validate()

    def validate(self) -> None:
        """Cross-field rules; raise :class:`OptionError` naming a field."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (enums as their strings, tuples as lists); secret
        fields are left out."""
        out: dict[str, Any] = {}
        for s in specs(type(self)):
            if not s.meta.secret:
                out[s.name] = _plain(getattr(self, s.name))
        return out


def _plain(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, Declared):
        return v.to_dict()
    return v


D = typing.TypeVar("D", bound=Declared)


def from_values(cls: type[D], values: Mapping[str, Any], *, verb: str | None = None) -> D:
    """``cls`` from parameter values (the CLI's namespace, a job's options):
    keys that are not ``cls``'s fields are ignored, missing ones take their
    defaults. With ``verb``, fields that verb does not take keep their defaults."""
    kwargs = {}
    for s in specs(cls):
        if s.name in values and (verb is None or verb in s.verbs):
            kwargs[s.name] = values[s.name]
    return cls(**kwargs)


def exposed(cls: type[Declared], verb: str) -> list[Spec]:
    """The options of ``cls`` that ``verb`` takes from the CLI and the service."""
    return [s for s in specs(cls) if s.exposed and verb in s.verbs]
