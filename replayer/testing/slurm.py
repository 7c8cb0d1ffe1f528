"""A real single-node Slurm cluster for tests, provisioned and run here.

Labs reach their GPU nodes through Slurm, so the Slurm pool is tested
against the real scheduler, not a fake of ``sbatch``. This module gives
tests a cluster of their own (../shared/SLURM.md has the measured facts):

* :func:`provision` installs Debian's ``slurm-wlm`` and ``munge`` when they
  are missing and the machine allows it (root, ``apt-get``); where it cannot
  it raises :class:`SlurmUnavailable` with one line that says why (``make
  test`` prints it and the tier is skipped with it).
* :class:`LocalSlurm` writes ``slurm.conf`` and ``gres.conf`` (4 fake GPUs,
  up to 4 jobs sharing the cores) into a private directory with its own
  state and free ports, so it never meets another cluster on the machine;
  starts ``munged`` if no munge daemon answers, then ``slurmctld`` and
  ``slurmd``; waits until ``sinfo`` shows the node idle; and stops its
  daemons by their pid files (never by name) and removes its state.
  :meth:`LocalSlurm.env` is what a client needs (``SLURM_CONF``).

Every subprocess call is bounded in time: a drained node or a stalled
controller makes Slurm's clients wait forever, silently.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("slurmctld", "slurmd", "munged")
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo")
CALL_TIMEOUT = 30.0
"""Seconds one client or daemon-start call may take."""
INSTALL_TIMEOUT = 600.0
"""Seconds ``apt-get update`` plus the install may take (19 s measured)."""
START_TIMEOUT = 60.0
"""Seconds until the node must show idle (3 s measured)."""
STOP_TIMEOUT = 15.0
"""Seconds a daemon gets to exit after SIGTERM, before SIGKILL."""
GPUS = 4
PARTITION = "gpu"


class SlurmUnavailable(RuntimeError):
    """Slurm cannot run here; the message is the one-line reason."""


def _run(
    argv: Sequence[str],
    *,
    timeout: float = CALL_TIMEOUT,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """One bounded call; :class:`SlurmUnavailable` when it cannot run or hangs."""
    try:
        return subprocess.run(
            list(argv),
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{argv[0]} did not finish within {timeout:g} s") from None
    except OSError as exc:
        raise SlurmUnavailable(f"cannot run {argv[0]}: {exc.strerror or exc}") from None


def _text(proc: subprocess.CompletedProcess[bytes]) -> str:
    return (proc.stderr or proc.stdout).decode(errors="replace").strip()


def _which(name: str) -> str | None:
    """A program on PATH or in the sbin directories daemons live in."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/local/sbin"])
    return shutil.which(name, path=path)


def missing() -> list[str]:
    """The Slurm and munge programs this machine lacks."""
    return [p for p in (*DAEMONS, *CLIENTS, "munge", "unmunge") if _which(p) is None]


def provision() -> None:
    """Slurm's programs, installed with ``apt-get`` if missing. Raises
    :class:`SlurmUnavailable` (one line) where they are missing and cannot
    be installed."""
    if not missing():
        return
    if sys.platform != "linux":
        raise SlurmUnavailable(f"Slurm runs on Linux; this is {sys.platform}")
    if os.geteuid() != 0:
        raise SlurmUnavailable(
            f"{', '.join(missing())} missing and not root (install {' '.join(PACKAGES)})"
        )
    if shutil.which("apt-get") is None:
        raise SlurmUnavailable(
            f"{', '.join(missing())} missing and no apt-get (install {' '.join(PACKAGES)})"
        )
    print(f"replayer: installing {' '.join(PACKAGES)} (once, ~30 s)", file=sys.stderr, flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + INSTALL_TIMEOUT
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
    ):
        left = deadline - time.monotonic()
        if left <= 0:
            raise SlurmUnavailable(
                f"installing {' '.join(PACKAGES)} took over {INSTALL_TIMEOUT:g} s"
            )
        proc = _run(argv, timeout=left, env=env)
        if proc.returncode != 0:
            tail = _text(proc).splitlines()[-1:] or ["no output"]
            raise SlurmUnavailable(f"{' '.join(argv[:2])} failed ({proc.returncode}): {tail[0]}")
    if missing():
        raise SlurmUnavailable(f"installed {' '.join(PACKAGES)} but {', '.join(missing())} missing")


def prerequisites() -> str | None:
    """Why a cluster cannot start here, checked without installing anything."""
    lack = missing()
    if lack:
        return f"{', '.join(lack)} not installed (make slurm-env installs them as root)"
    if os.geteuid() != 0:
        return "the test cluster runs its daemons as root (SlurmUser=root); not root"
    return None


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports nothing listens on now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def munge_works() -> bool:
    """Whether a munge daemon answers (``munge -n | unmunge``)."""
    try:
        cred = _run(["munge", "-n"], timeout=10)
        if cred.returncode != 0:
            return False
        return _run(["unmunge"], input=cred.stdout, timeout=10).returncode == 0
    except SlurmUnavailable:
        return False


def start_munge() -> None:
    """Start the system's ``munged`` as user munge (it daemonizes), as
    Debian's service would; its key comes with the package."""
    if munge_works():
        return
    run_dir = Path("/run/munge")
    run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(KeyError, OSError):
        shutil.chown(run_dir, "munge", "munge")
    if not Path("/etc/munge/munge.key").exists():
        raise SlurmUnavailable("no /etc/munge/munge.key (reinstall munge)")
    proc = _run(["su", "-s", "/bin/sh", "munge", "-c", "munged --force"])
    if proc.returncode != 0:
        raise SlurmUnavailable(f"munged did not start: {_text(proc)[:200]}")
    for _ in range(50):  # bounded: the socket comes up within a second
        if munge_works():
            return
        time.sleep(0.1)  # polling munge's answer (bounded above)
    raise SlurmUnavailable("munged started but munge -n | unmunge still fails")


class LocalSlurm:
    """A one-node Slurm cluster in a private directory (context manager).

    Usage::

        with LocalSlurm() as cluster:
            subprocess.run(["sbatch", "--wrap", "true"], env=cluster.env())
    """

    def __init__(self, root: Path | None = None, *, gpus: int = GPUS) -> None:
        self._own_root = root is None
        self.root = root if root is not None else Path(tempfile.mkdtemp(prefix="replayer-slurm-"))
        self.gpus = gpus
        self.node = socket.gethostname().split(".")[0]
        self.partition = PARTITION
        self.conf = self.root / "slurm.conf"
        self.ctld_port, self.d_port = free_ports(2)
        self.started = False

    # -- the configuration ------------------------------------------------------------

    @property
    def pid_files(self) -> dict[str, Path]:
        return {"slurmctld": self.root / "ctld.pid", "slurmd": self.root / "d.pid"}

    @property
    def logs(self) -> dict[str, Path]:
        return {"slurmctld": self.root / "log" / "ctld.log", "slurmd": self.root / "log" / "d.log"}

    def slurm_conf(self) -> str:
        r = self.root
        lines = [
            f"ClusterName=replayer{self.ctld_port}",
            f"SlurmctldHost={self.node}",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.d_port}",
            "AuthType=auth/munge",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldLogFile={self.logs['slurmctld']}",
            f"SlurmdLogFile={self.logs['slurmd']}",
            f"SlurmctldPidFile={self.pid_files['slurmctld']}",
            f"SlurmdPidFile={self.pid_files['slurmd']}",
            "ReturnToService=2",
            # without it the node registers INVAL (fewer real CPUs than configured)
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            # a job's record stays a while after it ended (its exit code)
            "MinJobAge=300",
            "GresTypes=gpu",
            f"NodeName={self.node} CPUs=8 RealMemory=20000 Gres=gpu:{self.gpus} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE "
            "State=UP OverSubscribe=FORCE:4",
        ]
        return "\n".join(lines) + "\n"

    def gres_conf(self) -> str:
        # a gpu gres without File= reports count 0 and drains the node
        return f"NodeName={self.node} Name=gpu File={self.root / 'gpu'}[0-{self.gpus - 1}]\n"

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default this process's environment) with ``SLURM_CONF``
        pointing Slurm's clients at this cluster."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    # -- running ----------------------------------------------------------------------

    def start(self) -> Self:
        """Write the configuration, start the daemons, wait for an idle node.
        Raises :class:`SlurmUnavailable` (one line) when it cannot."""
        why = prerequisites()
        if why:
            raise SlurmUnavailable(why)
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        for i in range(self.gpus):
            (self.root / f"gpu{i}").touch()
        self.conf.write_text(self.slurm_conf())
        (self.root / "gres.conf").write_text(self.gres_conf())
        self.started = True
        try:
            start_munge()
            for daemon in ("slurmctld", "slurmd"):
                # -i: ignore state another run left (there is none: a fresh directory)
                argv = [_which(daemon) or daemon, "-f", str(self.conf)]
                proc = _run([*argv, "-i"] if daemon == "slurmctld" else argv, env=self.env())
                if proc.returncode != 0:
                    raise SlurmUnavailable(
                        f"{daemon} did not start ({proc.returncode}): {_text(proc)[:200]}"
                    )
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        state = ""
        while time.monotonic() < deadline:
            proc = _run(["sinfo", "-h", "-N", "-o", "%t"], env=self.env(), timeout=10)
            state = proc.stdout.decode(errors="replace").strip() or _text(proc)
            if proc.returncode == 0 and state.startswith("idle"):
                return
            time.sleep(0.2)  # polling the node's state (bounded above)
        raise SlurmUnavailable(
            f"the node is not idle after {START_TIMEOUT:g} s ({state[:100] or 'no answer'}); "
            f"{self.node_reason()}"
        )

    def node_reason(self) -> str:
        """``scontrol show node``'s state and reason (why a node drained)."""
        try:
            proc = _run(["scontrol", "show", "node", self.node], env=self.env(), timeout=10)
        except SlurmUnavailable as exc:
            return str(exc)
        words = proc.stdout.decode(errors="replace").split()
        return " ".join(w for w in words if w.startswith(("State=", "Reason="))) or _text(proc)

    def squeue(self) -> list[tuple[str, str, str]]:
        """(job id, name, state) of every job in the queue."""
        proc = _run(["squeue", "-h", "-o", "%i|%j|%T"], env=self.env())
        if proc.returncode != 0:
            raise SlurmUnavailable(f"squeue failed: {_text(proc)[:200]}")
        out = proc.stdout.decode(errors="replace")
        rows = [tuple(line.split("|", 2)) for line in out.splitlines() if line.count("|") == 2]
        return [(a, b, c) for a, b, c in rows]

    def jobs(self) -> list[tuple[str, str, str]]:
        """(job id, name, state) of every job the controller knows, ended ones
        too (kept ``MinJobAge`` seconds): what ran, where ``squeue`` shows
        only what runs."""
        proc = _run(["scontrol", "-o", "show", "jobs"], env=self.env())
        if proc.returncode != 0:
            raise SlurmUnavailable(f"scontrol show jobs failed: {_text(proc)[:200]}")
        out = []
        for line in proc.stdout.decode(errors="replace").splitlines():
            f = dict(w.split("=", 1) for w in line.split() if "=" in w)
            if "JobId" in f:
                out.append((f["JobId"], f.get("JobName", ""), f.get("JobState", "")))
        return out

    def _pid(self, daemon: str) -> int | None:
        try:
            return int(self.pid_files[daemon].read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Cancel every job, stop the two daemons by their pid files (SIGTERM,
        then SIGKILL), remove the directory it made. munged stays: it is the
        machine's, shared by every cluster on it."""
        if self.started and self._pid("slurmctld") is not None:
            with contextlib.suppress(SlurmUnavailable):
                _run(["scancel", "--full", "--quiet", f"--partition={self.partition}"],
                     env=self.env(), timeout=10)  # fmt: skip
        for daemon in ("slurmd", "slurmctld"):
            pid = self._pid(daemon)
            if pid is not None:
                _terminate(pid)
        self.started = False
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            for d in ("state", "spool"):
                shutil.rmtree(self.root / d, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _terminate(pid: int) -> None:
    """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT`; returns once it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline:
        if not _exists(pid):
            return
        time.sleep(0.05)  # polling the pid (bounded above)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a daemon is not our child: a zombie shows in /proc until its parent reaps it
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m replayer.testing.slurm provision|check``: used by ``make test``.
    ``provision`` exits 0 with one line on stderr where Slurm cannot be had
    (the tier is then skipped with that line); ``check`` starts and stops a
    cluster once."""
    args = list(sys.argv[1:] if argv is None else argv)
    cmd = args[0] if args else "provision"
    if cmd not in ("provision", "check"):
        print("usage: python -m replayer.testing.slurm [provision|check]", file=sys.stderr)
        return 2
    try:
        provision()
        if cmd == "check":
            with LocalSlurm() as cluster:
                print(f"replayer: slurm node {cluster.node} idle ({cluster.conf})")
    except SlurmUnavailable as exc:
        print(f"replayer: Slurm unavailable: {exc}", file=sys.stderr)
        return 0 if cmd == "provision" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
