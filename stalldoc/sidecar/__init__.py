"""The sidecar: the watcher process ``stalldoc watch`` starts beside the job (``process.py``,
run as ``python -m stalldoc.sidecar`` by the relay). Everything that can fail runs here, never in
the process the shell waits on. ``watcher.py`` is the tick loop: discover the ranks, sample
(``sampling.py``: the probes), keep the histories (``history.py``), read the job's output
(``log_feed.py``), decide on stalls (``detect``), diagnose (``analysis``, ``rules``), record
(``findings``, ``store``), serve metrics (``metrics.py``), publish to the other nodes
(``cluster.py``). ``link.py`` talks to the relay.

May import: the stages (``probes``, ``detect``, ``analysis``, ``rules``, ``findings``,
``store``, ``cluster``, ``launch``, ``model``), ``report`` (its findings' text), ``run``,
``check`` (the launch checks before the job), ``agent`` (what it publishes), ``errors``,
``redact``; never the relay, and nothing imports it but ``attach`` (which runs a watcher without
a relay).
"""
