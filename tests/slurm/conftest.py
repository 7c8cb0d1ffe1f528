"""The Slurm tier's cluster: one real single-node Slurm per pytest process
(:class:`replayer.testing.slurm.LocalSlurm`: its own directory, state and
ports), its ``SLURM_CONF`` in this process's environment so the pools'
``sbatch``/``squeue``/``scancel`` (and a CLI started from here) reach it.
Where no cluster can start, every test of the tier is skipped with the one
line that says why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from replayer.testing.slurm import LocalSlurm, SlurmUnavailable


@pytest.fixture(scope="session")
def slurm() -> Iterator[LocalSlurm]:
    cluster = LocalSlurm()
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        pytest.skip(f"Slurm unavailable: {exc}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(cluster.conf))
        try:
            yield cluster
        finally:
            cluster.stop()
