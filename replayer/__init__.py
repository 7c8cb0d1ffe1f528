"""replayer: a long-context, multi-turn crash reproducer for LLM serving.

The package is laid out along the data flow: ``trace`` (the on-disk format,
importers, synthesis) -> ``record`` -> ``replay`` -> ``monitor`` -> ``minimize``
-> ``bundle``, plus the vLLM ``emulator``, the ``service`` and the ``cli``.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
