"""``stalldoc logs FILE...``: the findings of the log rules on the logs of a job nobody watched.

``files``: a saved log read line by line (plain or gzip; its encoding, its rank, what is no log).
``times``: the time each line's stamp says. ``session``: the files' lines merged on one clock,
read by the tick rules as the watcher reads a live job's output, stored as a run, rendered in
any report format.

May import: ``rules``, ``findings``, ``store``, ``report``, ``run`` (the run directory),
``model``, ``errors``, ``redact``.
"""
