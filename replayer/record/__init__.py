"""The recorder: ``replayer record``, a transparent recording proxy for agent sessions.

The best trace is the production traffic that crashed, and agents send no
session ids. The recorder sits between agent and server, forwards every
byte unchanged and at the upstream's cadence, and writes the chat and
completions exchanges into a trace (each written before its client has the
whole response, so SIGKILL loses no exchange a client saw complete),
inferring sessions from the conversations
themselves and never storing a credential.

Modules, in the order a request meets them:

* :mod:`~replayer.record.proxy` - the aiohttp reverse proxy (relay, hop-by-hop
  headers, 502 when the upstream is down);
* :mod:`~replayer.record.recorder` - request ids, timings, rows;
* :mod:`~replayer.record.sessions` - session inference (headers, prefixes, forks);
* :mod:`~replayer.record.capture` - the response assembled from SSE or JSON;
* :mod:`~replayer.record.redact` - what is never stored;
* :mod:`~replayer.record.sink` - the writer thread and its group commit;
* :mod:`~replayer.record.segments` - non-overwriting segments and ``merge``;
* :mod:`~replayer.record.run` - the process: signals, progress, port file.
"""
