"""How ``replayer serve`` runs (:class:`ServeOptions`)."""

from __future__ import annotations

from dataclasses import dataclass

from replayer._declare import Declared, option


def size_value(text: str) -> int:
    """Bytes, or ``512M``/``8G``."""
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    try:
        if t and t[-1] in mult:
            return int(float(t[:-1]) * mult[t[-1]])
        return int(t)
    except ValueError:
        raise ValueError(f"want bytes or 512M/8G, not {text!r}") from None


@dataclass(frozen=True)
class ServeOptions(Declared):
    """The job service: where it keeps jobs, what it runs on, who may use it."""

    __group__ = "service"
    __verbs__ = frozenset({"serve"})

    data: str | None = option(None, "jobs and traces", metavar="DIR", required=True)
    host: str = option("127.0.0.1", "address to bind (default 127.0.0.1)")
    port: int = option(9000, "port (default 9000; 0: any free)", ge=0, le=65535)
    targets: str | None = option(None, "targets.toml: what jobs run on", metavar="TOML")
    max_concurrent_jobs: int = option(
        1,
        "jobs running at once (default 1); the rest queue. Jobs never share a target",
        metavar="N",
        ge=1,
    )
    token_file: str | None = option(
        None, "bearer token (default: $REPLAYER_SERVE_TOKEN)", metavar="F"
    )
    max_upload: int = option(
        8 << 30, "largest trace upload (default 8G)", metavar="BYTES", parse=size_value, ge=1
    )
    cancel_grace: float = option(
        30.0,
        "seconds a cancelled job gets to stop its servers before it is killed",
        metavar="S",
        ge=0,
    )
    port_file: str | None = option(
        None,
        "write the bound port here once listening (for supervisors and tests)",
        metavar="F",
    )
