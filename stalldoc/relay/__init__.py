"""The relay: the process the shell waits on (``relay.py``). It starts the job, passes its output
through to the terminal unchanged (``streams.py``, ``foreground.py``, ``plain.py``), forwards
signals, starts the sidecar and feeds it (``sidecar_link.py``), ends what the job leaves behind
(``leftovers.py``), and exits with the job's own status. It never waits on the sidecar.

May import: ``run`` (the run directory, options, the channel, the terminal), ``probes.exits``
(decoding a wait status, nothing more), ``errors``, ``stalldoc`` (its location); never the
sidecar, another stage or a rule (what can fail lives in the sidecar).
"""
