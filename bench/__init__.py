"""Benchmarks (``make bench``): speed, memory and storage figures that the
tests never assert on. Each module defines ``main(argv) -> dict`` and prints a
Markdown table; figures land in ``bench/out/<name>.json`` and, by hand with
the command that produced them, in ``bench/RESULTS.md``."""
