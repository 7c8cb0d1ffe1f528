"""The declared options (:mod:`replayer.options`) as argparse flags, and
library errors in flag words.

Nothing here knows an option by name: each verb's flags are generated from
the declarations that verb takes, so the CLI cannot drift from the library's
defaults, bounds or choices.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, TypeVar

from replayer import options
from replayer.errors import OptionError, ReplayerError
from replayer.options import Declared, Spec

D = TypeVar("D", bound=Declared)


def add_options(p: argparse.ArgumentParser, verb: str) -> None:
    """Every declared option ``verb`` takes, one argparse group per value object."""
    for cls in options.VERBS[verb]:
        got = options.exposed(cls, verb)
        if not got:
            continue
        g = p.add_argument_group(cls.__group__ or None)
        for s in got:
            add_spec(g, s)


def add_spec(g: Any, s: Spec) -> None:
    help_text = s.help.replace("%", "%%") or None
    kw: dict[str, Any] = {"dest": s.name, "help": help_text}
    if s.flag:
        kw["action"] = "store_false" if s.negated else "store_true"
        kw["default"] = s.default
    else:
        kw["metavar"] = s.metavar
        if s.repeat:
            kw["action"] = "append"
            kw["default"] = None  # argparse appends to a default list: the default is the object's
        else:
            kw["default"] = s.default
        if s.choices:
            kw["choices"] = s.choices
            kw.pop("metavar")
        elif s.parser() is not None:
            kw["type"] = _typed(s)
        if s.meta.required:
            kw["required"] = True
            kw.pop("default")
    g.add_argument(s.spelling, *s.meta.aliases, **kw)


def _typed(s: Spec) -> Any:
    """The option's own parser, its error as argparse's one line."""

    def parse(text: str) -> Any:
        try:
            return s.parse(text)
        except OptionError as exc:
            raise argparse.ArgumentTypeError(exc.problem) from None

    parse.__name__ = s.name
    return parse


def values(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed values, repeatable options left out when not given (their
    default is the value object's)."""
    return {k: v for k, v in vars(args).items() if v is not None or k not in _REPEATED}


_REPEATED = frozenset(
    s.name
    for classes in options.VERBS.values()
    for cls in classes
    for s in options.specs(cls)
    if s.repeat
)


def build(cls: type[D], args: argparse.Namespace, verb: str) -> D:
    """``cls`` from what ``verb``'s command line was given."""
    built: D = options.from_values(cls, values(args), verb=verb)
    return built


_PARAM = re.compile(r"(?<![\w-])([a-z]+(?:_[a-z]+)+|url|launch|vary|control)(?![\w-])")


def flag_words(exc: ReplayerError) -> str:
    """A library error as the CLI says it: parameters become their flags
    (``launch and restart_cmd are exclusive`` -> ``--launch and --restart-cmd ...``)."""
    if not isinstance(exc, OptionError):
        return str(exc)
    problem = _PARAM.sub(lambda m: options.spelling(m.group(1)), exc.problem)
    return f"{options.spelling(exc.param)} {problem}"
