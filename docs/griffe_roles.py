"""A griffe extension for the API reference: replayer's docstrings use Sphinx
roles (``:class:`~replayer.errors.ReplayerError```) and ``::`` before literal
blocks, which Markdown would print as they are. Before a docstring is rendered,
a role becomes a code span of its target (its last component where the target
starts with ``~``) and a trailing ``::`` a colon; the source is not changed.
mkdocs.yml loads it (``extensions``); nothing in ``replayer`` imports it."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|exc|data|obj|const):`(~?)([^`]+)`")
LITERAL = re.compile(r"(?<=\S)::$", re.M)


def markdown(text: str) -> str:
    """The docstring with its roles as code spans and ``::`` as ``:``."""

    def role(m: re.Match[str]) -> str:
        short, target = m.groups()
        return f"`{target.rsplit('.', 1)[-1] if short else target}`"

    return LITERAL.sub(":", ROLE.sub(role, text))


class SphinxRoles(griffe.Extension):
    """Rewrites each docstring griffe reads (see the module doc)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
