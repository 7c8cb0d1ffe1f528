"""The service's OpenAPI 3.1 document, generated from what the handlers use.

Nothing here is written twice: the paths come from the routes table that
:meth:`replayer.service.app.Service.app` registers (:data:`Route` rows), a
job's ``options`` from the declared options each job kind takes
(:func:`replayer.options.options_of`, the CLI's flags come from the same
declarations) less the ones the server owns (:mod:`replayer.service.specs`),
and the target and pool names from ``targets.toml``. A route or an option
added there is in the document by construction; ``tests/service/test_openapi.py``
checks the document against the live router, and fuzzes a live service with
it (schemathesis).
"""

from __future__ import annotations

import enum
import re
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from replayer import options
from replayer._version import __version__
from replayer.options import Spec

JsonSchema = dict[str, Any]

ERROR_TEXT: dict[int, str] = {
    400: "bad input: a refused body, parameter or path (nothing was changed)",
    401: "no token, or a wrong one (WWW-Authenticate says how to send it)",
    404: "no such job, file or report",
    409: "the state forbids it (a job already ended, a trace name taken)",
    413: "the upload exceeds the service's limit",
}


@dataclass(frozen=True, slots=True)
class Query:
    """One query parameter of a route."""

    name: str
    schema: JsonSchema
    description: str


@dataclass(frozen=True, slots=True)
class Route:
    """One row of the routes table: what the router registers and the
    document describes (see :data:`replayer.service.app.ROUTES`)."""

    method: str
    path: str
    """aiohttp's pattern (``{path:.+}``: a parameter that takes slashes)."""
    handler: str
    """The :class:`~replayer.service.app.Service` method that answers it."""
    summary: str
    ok: int = 200
    media: str = "application/json"
    """What a success returns (``application/json``: :attr:`schema`)."""
    schema: str | None = None
    """The name of the success body's schema under ``components/schemas``."""
    body: str | None = None
    """The request body: a schema name (JSON) or ``application/octet-stream``."""
    query: tuple[Query, ...] = ()
    errors: tuple[int, ...] = (400,)
    public: bool = False
    """Answered without the token (only ``/healthz``)."""

    @property
    def openapi_path(self) -> str:
        return re.sub(r"\{(\w+):[^}]*\}", r"{\1}", self.path)

    @property
    def params(self) -> list[str]:
        return re.findall(r"\{(\w+)", self.path)


# -- declared options as JSON Schema ----------------------------------------------------------


def _arms(tp: Any) -> list[Any]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def _bounds(spec: Spec) -> JsonSchema:
    m, out = spec.meta, {}
    if m.ge is not None:
        out["minimum"] = m.ge
    if m.gt is not None:
        out["exclusiveMinimum"] = m.gt
    if m.le is not None:
        out["maximum"] = m.le
    if m.lt is not None:
        out["exclusiveMaximum"] = m.lt
    return out


def _arm_schema(spec: Spec, tp: Any) -> JsonSchema | None:
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": "string", "enum": [str(m.value) for m in tp]}
    if typing.get_origin(tp) is Literal:
        return {"enum": list(typing.get_args(tp))}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", **_bounds(spec)}
    if tp is float:
        return {"type": "number", **_bounds(spec)}
    if tp is str:
        return {"type": "string"}
    return None


def option_schema(spec: Spec) -> JsonSchema:
    """What a job's ``options`` take for ``spec`` (see
    :func:`replayer.service.specs.option_values`): a flag ``true``/``false``;
    a repeatable option one value or a list; an option with a parser (a
    duration, a range) also its text."""
    if spec.flag:
        out: JsonSchema = {"type": "boolean"}
    elif spec.repeat:
        item = _arm_schema(spec, typing.get_args(_arms(spec.type)[0])[0]) or {"type": "string"}
        out = {"anyOf": [item, {"type": "array", "items": item}]}
    else:
        arms = [s for a in _arms(spec.type) if (s := _arm_schema(spec, a)) is not None]
        if spec.meta.parse is not None and {"type": "string"} not in arms:
            arms.append({"type": "string"})
        out = arms[0] if len(arms) == 1 else {"anyOf": arms or [{"type": "string"}]}
    if spec.help:
        out = {**out, "description": spec.help}
    default = _plain(spec.default)
    if default is not None and spec.default != ():
        out["default"] = default
    return out


def _plain(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    if isinstance(v, str | int | float | bool) or v is None:
        return v
    return None


def job_options(kind: str, refused: Iterable[str]) -> JsonSchema:
    """The ``options`` object of a ``kind`` job: its declared options by
    parameter name, less the ones a job may not set."""
    skip = set(refused)
    props = {s.name: option_schema(s) for s in options.options_of(kind).values()}
    return {
        "type": "object",
        "description": (
            f"The options of `replayer {kind}` by parameter name (the flag's "
            "spelling is accepted too); values are checked as the CLI checks them."
        ),
        "properties": {k: v for k, v in sorted(props.items()) if k not in skip},
        "additionalProperties": False,
    }


# -- the document -------------------------------------------------------------------------


def _ref(name: str) -> JsonSchema:
    return {"$ref": f"#/components/schemas/{name}"}


def _names(names: Iterable[str], what: str) -> JsonSchema:
    got = sorted(names)
    return {"type": "string", "enum": got} if got else {"type": "string", "description": what}


def job_request(
    kinds: Iterable[str],
    refused: Iterable[str],
    targets: Iterable[str],
    pools: Iterable[str],
    job_id: str,
) -> JsonSchema:
    """``POST /api/jobs``: one schema per kind, told apart by ``kind``."""
    refused = list(refused)
    target = _names(targets, "a target of targets.toml")
    common: JsonSchema = {
        "label": {"type": "string", "maxLength": 200},
    }
    path = {"type": "string", "description": "a path inside the data directory"}
    variants = []
    for kind in kinds:
        props: JsonSchema = {"kind": {"const": kind}, **common}
        props["options"] = job_options(kind, refused)
        required = ["kind"]
        if kind == "replay":
            props["trace"] = path
            props["targets"] = {"anyOf": [target, {"type": "array", "items": target}]}
            required += ["trace", "targets"]
        elif kind == "bisect":
            props["trace"] = path
            props["target"] = target
            props["control"] = target
            props["pool"] = _names(pools, "a pool of targets.toml")
            props["max_servers"] = {"type": "integer", "minimum": 1}
            required.append("trace")
        else:
            props["bundle"] = path
            props["job"] = {"type": "string", "pattern": job_id, "description": "a bisect job"}
            props["target"] = target
            required.append("target")
        variants.append(
            {
                "title": f"{kind} job",
                "type": "object",
                "properties": props,
                "required": required,
                "additionalProperties": False,
            }
        )
    return {"oneOf": variants, "discriminator": {"propertyName": "kind"}}


def _schemas(request: JsonSchema, states: list[str]) -> dict[str, JsonSchema]:
    nullable_str = {"type": ["string", "null"]}
    nullable_num = {"type": ["number", "null"]}
    job = {
        "type": "object",
        "required": ["id", "kind", "state", "created_at", "links"],
        "properties": {
            "id": {"type": "string"},
            "kind": {"type": "string"},
            "label": nullable_str,
            "state": {"type": "string", "enum": states},
            "targets": {"type": "array", "items": {"type": "string"}},
            "inputs": {"type": "object", "additionalProperties": {"type": "string"}},
            "options": {"type": "object"},
            "created_at": {"type": "number"},
            "started_at": nullable_num,
            "finished_at": nullable_num,
            "exit_code": {"type": ["integer", "null"]},
            "outcome": nullable_str,
            "message": nullable_str,
            "attempts": {"type": "integer"},
            "result": {"type": ["object", "null"]},
            "pool": nullable_str,
            "max_servers": {"type": ["integer", "null"]},
            "slots": {"type": "array", "items": {"type": "integer"}},
            "links": {"type": "object", "additionalProperties": {"type": "string"}},
            "progress": {"type": ["object", "null"]},
            "queue_position": {"type": ["integer", "null"]},
        },
    }
    trace = {
        "type": "object",
        "required": ["path", "bytes", "requests", "sha256"],
        "properties": {
            "path": {"type": "string"},
            "bytes": {"type": "integer"},
            "requests": {"type": "integer"},
            "sessions": {"type": "integer"},
            "sha256": {"type": "string"},
            "added_at": {"type": "number"},
            "how": {"type": "string"},
        },
    }
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "string"}},
        },
        "Health": {"type": "object", "required": ["status"], "properties": {"status": {}}},
        "Job": job,
        "JobList": {
            "type": "object",
            "required": ["jobs"],
            "properties": {"jobs": {"type": "array", "items": _ref("Job")}},
        },
        "JobRequest": request,
        "Trace": trace,
        "TraceList": {
            "type": "object",
            "required": ["traces"],
            "properties": {"traces": {"type": "array", "items": _ref("Trace")}},
        },
        "TraceRegister": {
            "type": "object",
            "required": ["path"],
            "properties": {"path": {"type": "string", "description": "a path inside DIR"}},
            "additionalProperties": False,
        },
        "TargetList": {
            "type": "object",
            "required": ["targets", "pools"],
            "properties": {
                "targets": {"type": "array", "items": {"type": "object"}},
                "pools": {"type": "array", "items": {"type": "object"}},
            },
        },
        "FileList": {
            "type": "object",
            "required": ["files"],
            "properties": {
                "files": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["path", "bytes"],
                        "properties": {
                            "path": {"type": "string"},
                            "bytes": {"type": "integer"},
                        },
                    },
                }
            },
        },
        "OpenAPI": {"type": "object", "required": ["openapi", "paths"]},
    }


def _operation(route: Route, path_params: Mapping[str, JsonSchema]) -> JsonSchema:
    op: JsonSchema = {"operationId": route.handler, "summary": route.summary}
    params: list[JsonSchema] = []
    for name in route.params:
        params.append({"name": name, "in": "path", "required": True, "schema": path_params[name]})
    for q in route.query:
        params.append(
            {"name": q.name, "in": "query", "schema": q.schema, "description": q.description}
        )
    if params:
        op["parameters"] = params
    if route.body == "application/octet-stream":
        op["requestBody"] = {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    elif route.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(route.body)}},
        }
    ok: JsonSchema = {"description": route.summary}
    if route.media == "application/json":
        ok["content"] = {route.media: {"schema": _ref(route.schema or "Error")}}
    else:
        ok["content"] = {route.media: {"schema": {"type": "string"}}}
    responses: JsonSchema = {str(route.ok): ok}
    statuses = set(route.errors) | ({400} if route.params else set())
    if not route.public:
        statuses.add(401)
        op["security"] = (
            [{"bearer": []}, {"basic": []}] if route.method == "GET" else [{"bearer": []}]
        )
    else:
        op["security"] = []
    for status in sorted(statuses):
        responses[str(status)] = {
            "description": ERROR_TEXT[status],
            "content": {"application/json": {"schema": _ref("Error")}},
        }
    op["responses"] = responses
    return op


def document(
    routes: Iterable[Route],
    *,
    path_params: Mapping[str, JsonSchema],
    request: JsonSchema,
    states: list[str],
) -> JsonSchema:
    """The OpenAPI 3.1 document of ``routes`` (see the module docstring)."""
    paths: dict[str, dict[str, JsonSchema]] = {}
    for r in routes:
        paths.setdefault(r.openapi_path, {})[r.method.lower()] = _operation(r, path_params)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "replayer serve",
            "version": __version__,
            "description": (
                "Replay, bisect and verify jobs as a service. Every route but /healthz "
                'needs the token; errors are {"error": "one line"}.'
            ),
        },
        "paths": paths,
        "components": {
            "schemas": _schemas(request, states),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "basic": {
                    "type": "http",
                    "scheme": "basic",
                    "description": "GET only: the token as the password (any user name)",
                },
            },
        },
    }
