"""One options layer: every option a job takes, declared once, validated once.

The CLI renders these tables into argparse (``replayer.cli.args``); the job
service checks a request's ``options`` object against the same tables and
builds the same frozen objects; the library takes those objects directly.
So a default, a choice list or a bound lives in exactly one place.

Options are named by their **parameter** (``max_inflight``); the CLI spells
them ``--max-inflight`` (or :attr:`Opt.cli` where it differs). Errors from
here are :class:`OptionError`: they name the parameter, and the CLI rewrites
that name to its flag, so a library user never reads about flags.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from replayer.bisect.pipeline import STAGES, BisectOptions
from replayer.errors import OptionError
from replayer.monitor.watch import WatchConfig
from replayer.replay.policy import Mode, OnFailure, Order, ReplayPolicy, ResponsesState, Timing
from replayer.target.base import ResetMode
from replayer.target.base import reset_mode as reset_mode  # the builders are all here


def duration(text: str) -> float:
    """Seconds, or ``30m``/``2h``/``1d``: bisect budgets are human-sized."""
    mult = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text and text[-1] in mult:
            return float(text[:-1]) * mult[text[-1]]
        return float(text)
    except ValueError:
        raise ValueError(f"want seconds or 30m/2h/1d, not {text!r}") from None


@dataclass(frozen=True, slots=True)
class Opt:
    """One option: its parameter name, how text becomes its value, its default."""

    name: str
    type: Callable[[str], Any] | None = str
    """Text to value (the CLI's and the service's); None for flags."""
    default: Any = None
    help: str = ""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    flag: bool = False
    """Present means True (``--keep-running``)."""
    negated: bool = False
    """A flag that sets its parameter to False (``--no-force-stream``)."""
    repeat: bool = False
    """May be given several times; the value is a list."""
    cli: str | None = None
    """The CLI's spelling where it is not ``--`` plus the dashed name."""
    required: bool = False

    @property
    def spelling(self) -> str:
        return self.cli or "--" + self.name.replace("_", "-")


@dataclass(frozen=True, slots=True)
class Group:
    title: str
    opts: tuple[Opt, ...]


def workers_value(text: str) -> int | str:
    """``--workers``: ``auto`` or a count of at least 1."""
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"want auto or a count of at least 1, not {text!r}")
    return n


def _f(name: str, default: float, metavar: str, help: str) -> Opt:
    return Opt(name, float, default, help, metavar)


POLICY = Group(
    "policy",
    (
        Opt(
            "timing",
            default="recorded",
            choices=tuple(t.value for t in Timing),
            help="recorded: absolute recorded offsets and think gaps (default); "
            "gaps: closed loop on think gaps; asap: dependencies only",
        ),
        Opt(
            "order",
            default="strict",
            choices=tuple(o.value for o in Order),
            help="strict: the server receives trace order (default); admitted: also wait for "
            "each stream's response headers, so the engine admits trace order; session: "
            "per session only",
        ),
        _f("speed", 1.0, "X", "divide recorded times by X (default 1)"),
        Opt("max_inflight", int, None, "at most N requests in flight per target", "N"),
        Opt(
            "mode",
            default="verbatim",
            choices=tuple(m.value for m in Mode),
            help="live: the target's replies replace recorded assistant turns (chat)",
        ),
        Opt(
            "responses_state",
            default="expand",
            choices=tuple(m.value for m in ResponsesState),
            help="Responses requests recorded with previous_response_id: expand (default: "
            "full context inline, no server store needed) or chain (own input, "
            "previous_response_id re-pointed at the live response; needs "
            "VLLM_ENABLE_RESPONSES_API_STORE=1)",
        ),
        Opt(
            "force_stream",
            None,
            True,
            "send bodies' own stream flag instead of streaming with usage",
            flag=True,
            negated=True,
            cli="--no-force-stream",
        ),
        Opt("model", default=None, help="replace the model of every body"),
        Opt(
            "skip_over_context",
            None,
            False,
            "skip requests longer than the target's max_model_len (else sent)",
            flag=True,
        ),
        _f("request_timeout", 1800.0, "S", "bound on one request, seconds (default 1800)"),
        Opt(
            "on_failure",
            default="stop",
            choices=tuple(o.value for o in OnFailure),
            help="stop dispatching to a failed target (default) or keep going",
        ),
        Opt(
            "session_header",
            default="X-Session-Id",
            metavar="NAME",
            help="header carrying the session id ('none' to omit)",
        ),
        Opt(
            "token_range",
            default=None,
            metavar="LO:HI",
            help="token ids for blocks payloads, e.g. 1000:150000",
        ),
        Opt("save_output", None, False, "keep response texts in results", flag=True),
        Opt(
            "body_cache_mb",
            int,
            512,
            "memory for bodies built ahead of dispatch, and for recent token-id "
            "bodies that later turns extend (each, default 512)",
            "MB",
        ),
        Opt(
            "workers",
            workers_value,
            "auto",
            "processes that build request bodies, sessions dealt among them (1: a "
            "thread); order, timing and results stay in one process (default auto: "
            "more than 1 only for a large trace, due faster than one process builds, "
            "on a machine with 4 or more cores)",
            "N|auto",
        ),
    ),
)

WATCH = Group(
    "monitor",
    (
        _f("health_interval", 1.0, "S", "poll /health every S seconds (default 1)"),
        _f(
            "health_timeout",
            2.0,
            "S",
            "a /health probe unanswered after S seconds timed out (default 2)",
        ),
        _f(
            "scrape_interval",
            2.0,
            "S",
            "scrape /metrics every S seconds into RUN/metrics.arrow (default 2)",
        ),
        Opt(
            "scrape",
            default=[],
            metavar="URL",
            repeat=True,
            help="also scrape this Prometheus endpoint (repeatable: node, GPU exporters)",
        ),
        _f(
            "stall_timeout",
            60.0,
            "S",
            "hang: no token progress for S seconds while /health stays 200 or "
            "stops answering (pending prefills get S + tokens / --min-prefill-rate)",
        ),
        _f(
            "min_prefill_rate",
            1000.0,
            "TOK_S",
            "prefill tokens/s any healthy server beats (default 1000)",
        ),
        _f(
            "settle",
            10.0,
            "S",
            "after a failure, watch S seconds more before classifying (default 10)",
        ),
        _f(
            "grace",
            3.0,
            "S",
            "after the last request, watch S seconds more for a late crash (default 3)",
        ),
        Opt(
            "no_monitor",
            None,
            False,
            "no health polling, scraping or hang watchdog",
            flag=True,
        ),
    ),
)

SELECTION = Group(
    "selection (ids, or inclusive 0-based ranges A..B)",
    (
        Opt("limit", int, None, "first N requests", "N"),
        Opt("sessions", default=None, metavar="SPEC", help="sessions by id or position"),
        Opt("requests", default=None, metavar="SPEC", help="requests by id or position"),
    ),
)

READY_TIMEOUT = _f(
    "ready_timeout",
    1800.0,
    "S",
    "seconds to wait for /health and /v1/models after a launch or restart "
    "(default 1800: big models load for minutes)",
)
"""One declaration for every command that starts a server."""

SERVER = Group(
    "target (one of --launch, --restart-cmd + --url, --url, --target)",
    (
        Opt(
            "launch",
            default=None,
            metavar="CMD",
            help="start the server with CMD (its own process group; log in RUN)",
        ),
        Opt(
            "restart_cmd",
            default=None,
            metavar="CMD",
            help="restart a server someone else runs (e.g. ssh node docker restart vllm)",
        ),
        Opt(
            "url",
            default=None,
            metavar="URL",
            help="where the server listens (read from --launch's --host/--port if absent; "
            "--target URL is the same)",
        ),
        Opt(
            "log_cmd",
            default=None,
            metavar="CMD",
            help="print the server's log (with --restart-cmd or --url)",
        ),
        READY_TIMEOUT,
        Opt(
            "reset",
            default="restart",
            choices=tuple(m.value for m in ResetMode),
            help="between passing trials: clear the prefix cache (dev mode), restart "
            "(default), or nothing",
        ),
        Opt(
            "api_key_env",
            default=None,
            metavar="VAR",
            help="the API key comes from $VAR (default: $REPLAYER_API_KEY)",
        ),
    ),
)

SEARCH = Group(
    "search",
    (
        Opt("stages", default=",".join(STAGES), metavar="LIST", help="stages to run"),
        Opt(
            "signature",
            default=None,
            metavar="REGEX",
            help="chase crashes whose signature text matches (default: the first crash)",
        ),
        Opt(
            "calibrate_matches",
            int,
            5,
            "calibration stops after N matching crashes (default 5)",
            "N",
            cli="--calibrate",
        ),
        Opt("calibrate_runs", int, 10, "... or after N runs (default 10)", "N"),
        Opt(
            "prefix_recheck",
            int,
            2,
            "after a binary prefix search, N more runs of the longest quiet prefix: "
            "each costs a steady crash a trial, and catches one flaky at shorter lengths "
            "(default 2)",
            "N",
        ),
        Opt(
            "shrink_steps",
            int,
            256,
            "the shrink stage cuts a text in at most N steps: each halving of N saves a "
            "trial per text and doubles the threshold's uncertainty (default 256)",
            "N",
        ),
        Opt("alpha", float, 0.05, "risk of dismissing a crashing candidate (default 0.05)", "P"),
        Opt("confirm", int, 10, "runs of the final repro to measure its rate (default 10)", "N"),
        Opt("max_trials", int, None, "stop after N trials (the best bundle so far is kept)", "N"),
        Opt("max_time", duration, None, "wall-clock budget: seconds, or 30m, 2h, 1d", "T"),
    ),
)

CONTROL = Group(
    "control (the platform that runs clean)",
    (
        Opt("control", default=None, metavar="NAME=URL", help="replay the final repro here too"),
        Opt(
            "control_launch", default=None, metavar="CMD", help="start the control server with CMD"
        ),
        Opt(
            "control_key",
            default=None,
            metavar="env:VAR|file:PATH",
            help="the control's API key (default: the target's)",
        ),
    ),
)

METRICS = Group(
    "live metrics (replayer's own, for Prometheus/Grafana)",
    (
        Opt(
            "metrics_port",
            int,
            None,
            "serve replayer_* metrics on http://HOST:PORT/metrics while running "
            "(0: any free port; the URL is printed on stderr)",
            "PORT",
        ),
        Opt(
            "metrics_host",
            default="127.0.0.1",
            metavar="HOST",
            help="address for --metrics-port (default 127.0.0.1; 0.0.0.0 for a remote Prometheus)",
        ),
    ),
)

RUNS = Opt("runs", int, 10, "runs (default 10)", "N")


@dataclass(frozen=True, slots=True)
class Selection:
    """Which requests of a trace: the first ``limit``, by session, by request
    (ids or inclusive 0-based ranges ``A..B``, comma-separated)."""

    limit: int | None = None
    sessions: str | None = None
    requests: str | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 0:
            raise OptionError("limit", "must not be negative")

    def to_dict(self) -> dict[str, Any]:
        return {"limit": self.limit, "sessions": self.sessions, "requests": self.requests}


# -- builders: a mapping of parameter values (defaults filled in) to objects ------------


def defaults(*groups: Group | Opt) -> dict[str, Any]:
    """Every parameter of ``groups`` at its default."""
    out: dict[str, Any] = {}
    for g in groups:
        for o in g.opts if isinstance(g, Group) else (g,):
            out[o.name] = list(o.default) if o.repeat else o.default
    return out


def _get(values: Mapping[str, Any], group: Group) -> dict[str, Any]:
    got = defaults(group)
    got.update({k: v for k, v in values.items() if k in got})
    return got


def replay_policy(values: Mapping[str, Any]) -> ReplayPolicy:
    """The :class:`ReplayPolicy` for these parameter values."""
    v = _get(values, POLICY)
    token_range = v["token_range"]
    if isinstance(token_range, str):
        try:
            lo, hi = (int(x) for x in token_range.split(":"))
        except ValueError:
            raise OptionError("token_range", f"wants LO:HI, not {token_range!r}") from None
        token_range = (lo, hi)
    if token_range is not None and not 0 <= token_range[0] < token_range[1]:
        raise OptionError(
            "token_range", f"wants 0 <= LO < HI, not {token_range[0]}:{token_range[1]}"
        )
    header = v["session_header"]
    for name, enum in (
        ("timing", Timing),
        ("order", Order),
        ("mode", Mode),
        ("responses_state", ResponsesState),
    ):
        _choice(name, v[name], enum)
    _choice("on_failure", v["on_failure"], OnFailure)
    try:
        return ReplayPolicy(
            timing=Timing(v["timing"]),
            order=Order(v["order"]),
            speed=float(v["speed"]),
            max_inflight=v["max_inflight"],
            mode=Mode(v["mode"]),
            responses_state=ResponsesState(v["responses_state"]),
            force_stream=bool(v["force_stream"]),
            model=v["model"],
            skip_over_context=bool(v["skip_over_context"]),
            request_timeout=float(v["request_timeout"]),
            on_failure=OnFailure(v["on_failure"]),
            session_header=None if header is None or header.lower() == "none" else header,
            token_range=token_range,
            save_output=bool(v["save_output"]),
            body_cache_mb=int(v["body_cache_mb"]),
            workers=v["workers"] if v["workers"] == "auto" else int(v["workers"]),
        )
    except ValueError as exc:  # ReplayPolicy's own bounds name their field first
        name, _, problem = str(exc).partition(" ")
        raise OptionError(name, problem) from None


def _choice(name: str, value: object, enum: Iterable[Any]) -> None:
    have = [e.value for e in enum]
    if value not in have:
        raise OptionError(name, f"{value!r}: want one of {', '.join(have)}")


def watch_config(values: Mapping[str, Any]) -> WatchConfig | None:
    """The monitor's :class:`WatchConfig`, or None for ``no_monitor``."""
    v = _get(values, WATCH)
    if v["no_monitor"]:
        return None
    for name in (
        "health_interval",
        "health_timeout",
        "scrape_interval",
        "stall_timeout",
        "min_prefill_rate",
    ):
        if not (isinstance(v[name], int | float) and v[name] > 0 and math.isfinite(v[name])):
            raise OptionError(name, "must be positive")
    for name in ("settle", "grace"):
        if not (isinstance(v[name], int | float) and v[name] >= 0):
            raise OptionError(name, "must not be negative")
    for url in v["scrape"]:
        if not str(url).startswith(("http://", "https://")):
            raise OptionError("scrape", f"{url!r}: want an http(s) URL")
    return WatchConfig(
        health_interval=float(v["health_interval"]),
        health_timeout=float(v["health_timeout"]),
        scrape_interval=float(v["scrape_interval"]),
        scrape=tuple(v["scrape"]),
        stall_timeout=float(v["stall_timeout"]),
        min_prefill_rate=float(v["min_prefill_rate"]),
        settle=float(v["settle"]),
        grace=float(v["grace"]),
    )


def selection(values: Mapping[str, Any]) -> Selection:
    v = _get(values, SELECTION)
    return Selection(v["limit"], v["sessions"], v["requests"])


def bisect_options(values: Mapping[str, Any]) -> BisectOptions:
    """The search's :class:`BisectOptions` (``signature``, the chased regex, is
    checked here and read by the caller: it pins the chase, not the search)."""
    v = _get(values, SEARCH)
    if v["signature"]:
        from replayer.monitor.signature import compile_signature_regex

        compile_signature_regex(v["signature"])
    stages = v["stages"]
    if isinstance(stages, str):
        stages = [s.strip() for s in stages.split(",") if s.strip()]
    return BisectOptions(
        stages=tuple(stages),
        calibrate_matches=v["calibrate_matches"],
        calibrate_runs=v["calibrate_runs"],
        prefix_recheck=v["prefix_recheck"],
        shrink_steps=v["shrink_steps"],
        confirm=v["confirm"],
        alpha=v["alpha"],
        max_trials=v["max_trials"],
        max_time=v["max_time"],
    )


def url(param: str, value: str | None) -> str | None:
    if value is not None and not value.startswith(("http://", "https://")):
        raise OptionError(param, f"{value!r}: must start with http:// or https://")
    return value


# -- the commands' option sets, for the job service ------------------------------------

LAUNCHED_REPLAY = Group(
    "launching the server (one target)",
    (
        Opt(
            "launch",
            default=None,
            metavar="CMD",
            help="start the server with CMD, wait until ready, replay, stop it; its log "
            "goes to RUN/server.log and a crash gets a signature",
        ),
        READY_TIMEOUT,
        Opt(
            "keep_running",
            None,
            False,
            "with --launch: leave the server running afterwards",
            flag=True,
        ),
    ),
)

COMMANDS: dict[str, tuple[Group | Opt, ...]] = {
    "replay": (LAUNCHED_REPLAY, POLICY, WATCH, SELECTION, METRICS),
    "bisect": (SERVER, SEARCH, CONTROL, POLICY, WATCH, SELECTION, METRICS),
    "verify": (SERVER, RUNS, WATCH),
}
"""What each job kind of the service accepts, by parameter name (the server
still refuses those it owns; output locations, resuming and terminal
options are the server's and appear in no table)."""


def command_options(kind: str) -> dict[str, Opt]:
    out: dict[str, Opt] = {}
    for g in COMMANDS[kind]:
        for o in g.opts if isinstance(g, Group) else (g,):
            out.setdefault(o.name, o)
    return out


def spelling(param: str) -> str:
    """The CLI flag of a parameter (for error messages)."""
    for groups in COMMANDS.values():
        for g in groups:
            for o in g.opts if isinstance(g, Group) else (g,):
                if o.name == param:
                    return o.spelling
    return "--" + param.replace("_", "-")
