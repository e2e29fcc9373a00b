"""``stalldoc attach``: diagnose a job that stalldoc did not start, from its pid.

``target``: the job from the pids given (up to its launcher), its ranks. ``session``: the look,
the verdict, ``--follow``, the stored run. ``link``: the watcher's link without a relay.
``log_tail``: ``--log FILE``. ``verdict``: the closing line.

May import: ``sidecar`` (its watcher, without a relay), ``run``, ``probes``, ``analysis``,
``rules``, ``model``, ``errors``, ``redact``.
"""
