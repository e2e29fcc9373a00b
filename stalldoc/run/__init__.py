"""What the relay, the sidecar and attach share about one run: its directory and its safety
rules (``rundir.py``), the watch options (``options.py``), the agent's environment
(``inject.py``), the relay-sidecar channel (``channel.py``), the job's process tree
(``job.py``), the nodes of a multi-node run (``nodes.py``) and the terminal (``terminal.py``).
Process-side: no stage imports it.

May import: ``agent`` (its file names and variables), ``launch`` (the launcher's flags),
``probes`` (the process table), ``store`` (the journal choice), ``private_files``, ``errors``,
``stalldoc`` (its location, for the bootstrap).
"""
