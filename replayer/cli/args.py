"""The options layer's tables as argparse groups, and its errors in flag words.

Every command that takes policy, monitor, selection, target or search
options gets them from :mod:`replayer.options`, so they are spelled,
defaulted and validated alike everywhere.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from replayer.errors import OptionError, ReplayerError
from replayer.options import Group, Opt, spelling


def add_group(p: argparse.ArgumentParser, group: Group, *, title: str | None = None) -> None:
    g = p.add_argument_group(title or group.title)
    for o in group.opts:
        add_opt(g, o)


def add_opt(g: Any, o: Opt, *aliases: str) -> None:
    kw: dict[str, Any] = {"dest": o.name, "help": o.help or None}
    if o.flag:
        kw["action"] = "store_false" if o.negated else "store_true"
    else:
        kw.update(default=list(o.default) if o.repeat else o.default, metavar=o.metavar)
        if o.repeat:
            kw["action"] = "append"
        if o.type is not str and o.type is not None:
            kw["type"] = _typed(o)
        if o.choices:
            kw["choices"] = o.choices
            kw.pop("metavar")
        if o.required:
            kw["required"] = True
    g.add_argument(o.spelling, *aliases, **kw)


def _typed(o: Opt) -> Any:
    conv = o.type
    assert conv is not None

    def parse(text: str) -> Any:
        try:
            return conv(text)
        except ValueError as exc:
            msg = str(exc) if conv not in (int, float) else f"invalid {conv.__name__} {text!r}"
            raise argparse.ArgumentTypeError(msg) from None

    parse.__name__ = getattr(conv, "__name__", "value")
    return parse


_PARAM = re.compile(r"(?<![\w-])([a-z]+(?:_[a-z]+)+|url|launch)(?![\w-])")


def flag_words(exc: ReplayerError) -> str:
    """A library error as the CLI says it: parameters become their flags
    (``launch and restart_cmd are exclusive`` -> ``--launch and --restart-cmd ...``)."""
    if not isinstance(exc, OptionError):
        return str(exc)
    problem = _PARAM.sub(lambda m: spelling(m.group(1)), exc.problem)
    return f"{spelling(exc.param)} {problem}"
