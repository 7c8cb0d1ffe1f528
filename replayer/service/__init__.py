"""``replayer serve``: replay, bisect and verify as jobs of a long-lived service.

A lab runs the reproducer next to its GPU servers: people submit jobs
("bisect this trace against mi355"), log off, and collect bundles later.

* :mod:`~replayer.service.app`: the aiohttp API, its middlewares (metrics,
  auth, path guard) and routes;
* :mod:`~replayer.service.specs`: job requests into the CLI's own argv;
* :mod:`~replayer.service.config`: ``targets.toml``, the only source of
  launch commands;
* :mod:`~replayer.service.pools`: pools of servers in ``targets.toml`` that
  bisect jobs share, each job's fair share and its own pool file;
* :mod:`~replayer.service.jobs`: one folder and one atomic state file per job;
* :mod:`~replayer.service.scheduler` and :mod:`~replayer.cli.worker`:
  one child process per running job, a concurrency limit, resume after restart;
* :mod:`~replayer.service.paths` and :mod:`~replayer.service.auth`: nothing
  outside the data directory, nobody without the token;
* :mod:`~replayer.service.progress`: a job's progress and result, from the
  files its command writes (journal, manifest, summary, log);
* :mod:`~replayer.service.traces`: streamed, size-limited, validated uploads
  and registrations;
* :mod:`~replayer.service.metrics`, :mod:`~replayer.service.page`: ``/metrics``
  and the jobs page;
* :mod:`~replayer.service.server`, :mod:`~replayer.service.launcher`: running
  it (one serve per data directory), and running it as a subprocess in tests
  and benchmarks;
* :mod:`~replayer.service.hooks`: where the HTML reports and live metrics plug in.

Nothing in :mod:`replayer` imports this package except ``replayer.cli.serve``.
"""
