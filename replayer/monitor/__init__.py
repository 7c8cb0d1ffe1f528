"""Deciding what happened to the server under test.

Health probes, metrics scraping and crash classification watch the target
while it runs; :mod:`replayer.monitor.signature` (over
:mod:`replayer.monitor.logs`) reads its log afterwards and names the crash, so
that minimization can tell "the same crash" from "another bug". Nothing here
starts, stops or restarts a server: that is :mod:`replayer.target`.
"""
