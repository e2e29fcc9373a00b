"""The sidecar: the watcher process ``stalldoc watch`` starts beside the job (``process.py``,
run as ``python -m stalldoc.sidecar`` by the relay). Everything that can fail runs here, never in
the process the shell waits on. ``watcher.py`` is the tick loop that calls its parts: who is
who in the job (``roster.py``: the ranks, their engines, attempts, a Ray job's driver and actors),
sample (``sampling.py``: the probes), keep the histories (``history.py``), read the job's output
(``log_feed.py``), judge the exits (``exit_judge.py``), decide on stalls and diagnose them
(``diagnosis.py``: ``detect``, ``analysis``, ``rules``), record (``findings``, ``store``), publish
(``publishing.py``: metrics, ``metrics.py``; the other nodes, ``cluster.py``; the status line).
What the parts share is ``context.py``; the rules' windows are ``windows.py``; the run's facts
beside its ticks ``run_facts.py``. ``link.py`` talks to the relay.

May import: the stages (``probes``, ``detect``, ``analysis``, ``rules``, ``findings``,
``store``, ``cluster``, ``launch``, ``model``), ``report`` (its findings' text), ``run``,
``check`` (the launch checks before the job), ``agent`` (what it publishes), ``errors``,
``redact``; never the relay, and nothing imports it but ``attach`` (which runs a watcher without
a relay).
"""
