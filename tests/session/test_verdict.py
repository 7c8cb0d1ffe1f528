"""What a trial's class means against the chase: a network failure is never
the chased crash, whatever is chased."""

from __future__ import annotations

import pytest

from replayer.session.verdict import Chase, infra_class

pytestmark = pytest.mark.inprocess


@pytest.mark.parametrize(
    "chase",
    [Chase(), Chase(failure_class="network"), Chase.of(regex="."), Chase.of(signature="x")],
)
def test_a_network_failure_never_matches(chase):
    assert not chase.matches(None, "network")


def test_a_crash_still_matches_an_unpinned_chase():
    assert Chase().matches(None, "stream_cut")
    assert Chase(failure_class="stream_cut").matches(None, "stream_cut")


def test_only_network_is_infra():
    assert infra_class("network")
    assert not any(infra_class(c) for c in ("stream_cut", "process_exit", "client_error", None))
