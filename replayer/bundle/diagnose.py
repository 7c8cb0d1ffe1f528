"""``bundle diagnose``: which kernel faulted, paid for once on a minimal bundle.

GPU errors are asynchronous: the HSA "Memory access fault", HIP's
``hipErrorIllegalAddress`` and CUDA's illegal access surface at some later
call and name no kernel. Serialized dispatch (``AMD_SERIALIZE_KERNEL=3``),
the HIP runtime's log (``AMD_LOG_LEVEL=4``), launch blocking
(``HIP_LAUNCH_BLOCKING=1``, ``CUDA_LAUNCH_BLOCKING=1``) and
``compute-sanitizer`` name it, at a cost no bisect trial should pay; a
minimal bundle is where to pay it once.

A **profile** is environment set on the launch plus, optionally, a command
put in front of it (``compute-sanitizer --tool memcheck``). The shipped list
(:func:`default_profiles`) is edited like ``--vary``'s variants: a TOML file
of ``[[profile]]`` tables or a JSON list of objects with keys ``name``,
``env`` (``{NAME = "value"}``), ``prefix`` (words), ``platform`` (``rocm``,
``cuda`` or ``any``), ``needs`` (a program that must be on PATH) and
``note``; ``default`` for the shipped list, ``default:NAME,...`` for some
of it. ``default`` runs the profiles of the launch's platform (ROCm when its
environment or replayer's has a ``HIP_*``, ``HSA_*``, ``ROCM_*``, ``AMD_*``,
``VLLM_ROCM_*`` or ``AITER*`` variable or ``/dev/kfd`` exists, else CUDA);
a profile named explicitly always runs. A profile whose ``needs`` is not
installed is skipped, with the reason.

What a run's server log says is read by :func:`find_fault`, first match
wins: compute-sanitizer's ``Invalid __global__ read`` report (``at
KERNEL+0x.. in FILE:LINE``), the ROCm debug agent's ``Disassembly for
function KERNEL`` with its ``FILE:LINE``, the HIP runtime's ``ShaderName :
KERNEL`` dispatch line (the last one before the fault: with serialized
dispatch, the faulting one) and an error line naming a kernel (``kernel:
NAME``, ``in kernel NAME``). The file and line, where the tool gives none,
are those of the launch: the traceback frame whose code launches the kernel
(``KERNEL[grid](...)``), else the innermost frame of Python's fault dump
(``most recent call first``) after the fault, which under serialized
dispatch is the launching thread.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayer._files import ENV_NAME, load_entries, named_entry, shipped_named
from replayer.errors import UsageError

PLATFORMS = ("rocm", "cuda", "any")
ROCM_PREFIXES = ("VLLM_ROCM_", "ROCM_", "HIP_", "HSA_", "AMD_", "AITER")
ROCM_DEVICE = Path("/dev/kfd")
_KEYS = ("name", "env", "prefix", "platform", "needs", "note")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True, slots=True)
class Profile:
    """One diagnostic relaunch (see the module docstring)."""

    name: str
    env: Mapping[str, str] = field(default_factory=dict)
    prefix: tuple[str, ...] = ()
    platform: str = "any"
    needs: str | None = None
    note: str | None = None


def default_profiles() -> list[Profile]:
    """The shipped list: ROCm first, then CUDA."""
    return [
        Profile(
            "serialize-kernels",
            env={"AMD_SERIALIZE_KERNEL": "3"},
            platform="rocm",
            note="every dispatch waited for: the fault surfaces at its kernel's launch",
        ),
        Profile(
            "amd-log-level-4",
            env={"AMD_LOG_LEVEL": "4"},
            platform="rocm",
            note="the HIP runtime logs each dispatch (ShaderName); large logs",
        ),
        Profile(
            "hip-launch-blocking",
            env={"HIP_LAUNCH_BLOCKING": "1"},
            platform="rocm",
            note="HIP waits for each launch",
        ),
        Profile(
            "cuda-launch-blocking",
            env={"CUDA_LAUNCH_BLOCKING": "1"},
            platform="cuda",
            note="CUDA waits for each launch: the error's stack is the launch's",
        ),
        Profile(
            "compute-sanitizer",
            prefix=("compute-sanitizer", "--tool", "memcheck"),
            platform="cuda",
            needs="compute-sanitizer",
            note="names kernel, file and line of the bad access; 10-100x slower",
        ),
    ]


# -- sources ----------------------------------------------------------------------------


def parse_profile(entry: object, where: str) -> Profile:
    """One ``[[profile]]`` table or JSON object."""
    fields, name, where = named_entry(entry, where, "profile", _KEYS)
    raw_env = fields.get("env", {})
    if not isinstance(raw_env, Mapping):
        raise UsageError(f"{where}: 'env' must be a table/object of NAME = \"value\"")
    env: dict[str, str] = {}
    for k, v in raw_env.items():
        if not isinstance(k, str) or not ENV_NAME.match(k) or not isinstance(v, str | int):
            raise UsageError(f"{where}: 'env' entry {k!r} must be NAME = \"value\"")
        env[k] = str(v)
    prefix = fields.get("prefix", [])
    if not isinstance(prefix, list) or not all(isinstance(w, str) and w for w in prefix):
        raise UsageError(f"{where}: 'prefix' must be a list of non-empty strings")
    platform = fields.get("platform", "any")
    if platform not in PLATFORMS:
        raise UsageError(f"{where}: 'platform' must be one of {', '.join(PLATFORMS)}")
    needs = fields.get("needs")
    note = fields.get("note")
    if needs is not None and not isinstance(needs, str):
        raise UsageError(f"{where}: 'needs' must be a program name")
    if note is not None and not isinstance(note, str):
        raise UsageError(f"{where}: 'note' must be a string")
    if not env and not prefix:
        raise UsageError(f"{where}: changes nothing (give env or prefix)")
    return Profile(name, env, tuple(prefix), str(platform), needs, note)


def load_file(path: Path) -> list[Profile]:
    """Profiles from a TOML (``[[profile]]``) or JSON (a list) file."""
    data = load_entries(path, "--profile", "profile")
    return [parse_profile(e, f"--profile {path}: profile {i + 1}") for i, e in enumerate(data)]


def looks_rocm(launch: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a launch runs on ROCm (see the module docstring)."""
    names = list(os.environ if environ is None else environ)
    try:
        words = shlex.split(launch)
    except ValueError:
        words = []
    names += [w.split("=", 1)[0] for w in words if _ASSIGN.match(w)]
    return any(n.startswith(ROCM_PREFIXES) for n in names) or ROCM_DEVICE.exists()


def load_profiles(
    sources: Sequence[str], launch: str, environ: Mapping[str, str] | None = None
) -> list[Profile]:
    """Every ``--profile`` source in order: files, ``default``, ``default:NAME,...``."""
    out: list[Profile] = []
    shipped = {p.name: p for p in default_profiles()}
    for src in sources:
        if src == "default":
            want = "rocm" if looks_rocm(launch, environ) else "cuda"
            out += [p for p in shipped.values() if p.platform in (want, "any")]
        elif src.startswith("default:"):
            out += shipped_named(src, shipped, "--profile", "profile")
        else:
            out += load_file(Path(src))
    names = [p.name for p in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"--profile: profile name(s) {', '.join(dup)} given twice")
    return out


def apply(profile: Profile, launch: str) -> tuple[str | None, str]:
    """``profile``'s launch command and what changed, or (None, why it is skipped)."""
    if profile.needs and shutil.which(profile.needs) is None:
        return None, f"{profile.needs} is not installed (not on PATH)"
    try:
        words = shlex.split(launch)
    except ValueError as exc:
        raise UsageError(f"--launch: cannot split {launch!r}: {exc}") from None
    env: dict[str, str] = {}
    while words and _ASSIGN.match(words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    changes = [f"{k}={v}" for k, v in profile.env.items() if env.get(k) != v]
    env.update(profile.env)
    if profile.prefix:
        changes.append(f"prefix {shlex.join(profile.prefix)}")
    if not changes:
        return None, "the launch already has it"
    head = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    return " ".join([*head, shlex.join([*profile.prefix, *words])]), ", ".join(changes)


# -- reading a log ----------------------------------------------------------------------

_PREFIX = re.compile(r"^\((?:[\w:-]+) pid=\d+\) (?:\w+ \d\d-\d\d [\d:]+ \[[^\]]*\] )?")
_SANITIZER_ERROR = re.compile(r"Invalid __(?:global|shared|local)__ (?:read|write|atomic)")
_SANITIZER_AT = (
    # CUDA 12: "at kernel(int *)+0x70 in /src/k.cu:5"
    re.compile(
        r"\bat (?P<kernel>[^\s+]+?(?:\([^)]*\))?)\+0x[0-9a-fA-F]+ in (?P<file>\S+):(?P<line>\d+)"
    ),
    # older: "at 0x70 in /src/k.cu:5:kernel(int *)"
    re.compile(r"\bat 0x[0-9a-fA-F]+ in (?P<file>[^\s:]+):(?P<line>\d+):(?P<kernel>\S+)"),
    # without -lineinfo: "at 0x70 in kernel(int *)"
    re.compile(r"\bat 0x[0-9a-fA-F]+ in (?P<kernel>[A-Za-z_]\w*)"),
)
_DEBUG_AGENT = re.compile(r"Disassembly for function (?P<kernel>[^(:\s]+)")
_FILE_LINE = re.compile(r"^(?P<file>/\S+\.\w+):(?P<line>\d+)$")
_SHADER = re.compile(r"\bShaderName\s*:\s*(?P<kernel>\S+)")
_NAMED = re.compile(
    r"(?:hipError\w*|illegal|fault).*?\b(?:in kernel|kernel:?) (?P<kernel>[A-Za-z_]\w+)"
)
_FAULT = re.compile(
    r"Memory access fault by GPU|illegal memory access|hipErrorIllegalAddress|"
    r"cudaErrorIllegalAddress|Code: 700|Invalid __\w+__ (?:read|write)|page fault",
    re.IGNORECASE,
)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)')
_DUMP = re.compile(r"\(most recent call first\):")
FAULT_LINES = 6


def _short(path: str) -> str:
    """A frame's file from its package on (``aiter/mla.py``)."""
    for mark in ("/site-packages/", "/dist-packages/"):
        if mark in path:
            return path.split(mark, 1)[1]
    return path


def find_fault(log: str) -> dict[str, Any] | None:
    """The faulting kernel, file and line ``log`` names (see the module
    docstring): ``kernel``, ``file``, ``line``, ``how`` (which tool said it)
    and ``lines`` (the log lines that say it); None when no kernel is named."""
    lines = [_PREFIX.sub("", raw) for raw in log.splitlines()]
    fault = next((i for i, t in enumerate(lines) if _FAULT.search(t)), None)
    kernel = file = line = how = None
    said: list[str] = []
    for i, t in enumerate(lines):  # compute-sanitizer
        if _SANITIZER_ERROR.search(t):
            for follow in lines[i + 1 : i + 4]:
                m = next((m for r in _SANITIZER_AT if (m := r.search(follow))), None)
                if m:
                    kernel, how = m["kernel"], "compute-sanitizer"
                    file, line = m.groupdict().get("file"), m.groupdict().get("line")
                    said = [t.strip(), follow.strip()]
                    break
            if kernel:
                break
    if kernel is None:  # the ROCm debug agent
        for i, t in enumerate(lines):
            m = _DEBUG_AGENT.search(t)
            if m:
                kernel, how, said = m["kernel"], "rocm debug agent", [t.strip()]
                for follow in lines[i + 1 : i + 6]:
                    fl = _FILE_LINE.match(follow.strip())
                    if fl:
                        file, line = fl["file"], fl["line"]
                        said.append(follow.strip())
                        break
                break
    if kernel is None:  # the HIP runtime's dispatch log, the last before the fault
        end = len(lines) if fault is None else fault
        shaders = [(i, m) for i, t in enumerate(lines[:end]) if (m := _SHADER.search(t))]
        if shaders:
            i, m = shaders[-1]
            kernel, how, said = m["kernel"], "HIP dispatch log (ShaderName)", [lines[i].strip()]
    if kernel is None:
        for t in lines:
            m = _NAMED.search(t)
            if m:
                kernel, how, said = m["kernel"], "error message", [t.strip()]
                break
    if kernel is None:
        return None
    if file is None:
        file, line, where = _launch_site(lines, kernel, fault)
        if where:
            said.append(where)
    if fault is not None and lines[fault].strip() not in said:
        said.append(lines[fault].strip())
    return {
        "kernel": kernel,
        "file": _short(file) if file else None,
        "line": int(line) if line else None,
        "how": how,
        "lines": [s[:300] for s in said[:FAULT_LINES]],
    }


def _launch_site(
    lines: Sequence[str], kernel: str, fault: int | None
) -> tuple[str | None, str | None, str | None]:
    """The frame that launches ``kernel``, else the innermost frame of a
    fault dump after the fault: (file, line, the frame's text)."""
    base = kernel.split("(")[0]
    launch = re.compile(rf"\b{re.escape(base)}\s*[\[(]")
    for i, t in enumerate(lines[:-1]):
        m = _FRAME.match(t)
        if m and launch.search(lines[i + 1]):
            return m["file"], m["line"], t.strip()
    start = fault or 0
    for i, t in enumerate(lines[start:], start):
        if _DUMP.search(t):
            for follow in lines[i + 1 : i + 3]:
                m = _FRAME.match(follow)
                if m:
                    return m["file"], m["line"], follow.strip()
            break
    return None, None, None


# -- the report -------------------------------------------------------------------------


def reading(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line: the kernel named, by which profile, or why none was."""
    named = [r for r in rows if r.get("fault")]
    if named:
        f = named[0]["fault"]
        where = f" ({f['file']}:{f['line']})" if f.get("file") else ""
        others = sorted({r["fault"]["kernel"] for r in named[1:]} - {f["kernel"]})
        extra = f"; other profiles named {', '.join(others)}" if others else ""
        return f"faulting kernel {f['kernel']}{where}, named under {named[0]['name']}{extra}"
    ran = [r for r in rows if r.get("outcome")]
    if not ran:
        return "no profile ran: nothing was learned"
    crashed = [r for r in ran if r.get("failure_class")]
    if not crashed:
        return "no profile crashed: the diagnostic settings hid the crash (or it is rare)"
    return "the crash came back, but no log named a kernel"


def section(diagnosis: Mapping[str, Any] | None) -> list[str]:
    """The bundle README's "Diagnosis" section."""
    if not diagnosis:
        return []
    lines = ["## Diagnosis", "", f"**{diagnosis.get('reading', '')}**", ""]
    rows = diagnosis.get("profiles") or []
    if rows:
        lines += ["| profile | change | outcome | kernel | file:line |", "|---|---|---|---|---|"]
        for r in rows:
            f = r.get("fault") or {}
            outcome = r.get("outcome") or f"skipped: {r.get('skipped')}"
            if r.get("failure_class"):
                outcome += f" ({r['failure_class']})"
            loc = f"`{f['file']}:{f['line']}`" if f.get("file") else "-"
            kernel = f"`{f['kernel']}`" if f.get("kernel") else "-"
            change = str(r.get("change") or "-").replace("|", "\\|")
            lines.append(f"| {r['name']} | `{change}` | {outcome} | {kernel} | {loc} |")
        for r in rows:
            f = r.get("fault")
            if f and f.get("lines"):
                lines += ["", f"What the log of `{r['name']}` says ({f['how']}):", "", "```"]
                lines += [*f["lines"], "```"]
                break
        lines += [
            "",
            "Each profile relaunched the server once with its settings and replayed this "
            "bundle (`replayer bundle diagnose`); its run and server log are in "
            f"`{diagnosis.get('out', 'the diagnose directory')}`.",
            "",
        ]
    return lines
