"""The conformance suite's ``vllm`` half joins the real-vLLM tier.

Its tests are parametrized ``[emulator, vllm]`` through one fixture, so the
real-vLLM fixtures are requested dynamically and tests/conftest.py cannot
see them: here the ``vllm`` items get the ``realvllm`` marker and move to the
end of the run (in file order, so the death test stays last), where the real
servers do not share the two cores with the emulator tier.

What the suite's modules share is in tests/helpers/conformance.py.
"""

from __future__ import annotations

import pytest


def _real(item: pytest.Item) -> bool:
    spec = getattr(item, "callspec", None)
    return (
        spec is not None
        and "tests/conformance/" in item.nodeid.replace("\\", "/")
        and "vllm" in spec.params.values()
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    real = [i for i in items if _real(i)]
    for item in real:
        item.add_marker(pytest.mark.realvllm)
    ids = {id(i) for i in real}
    items[:] = [i for i in items if id(i) not in ids] + real
