"""The in-process agent: it runs inside every rank of the watched job (loaded by
``bootstrap/sitecustomize.py``, started by ``start.py``), records phases, collectives, CUDA
markers and its identity into a state file of its own (``statefile.py``), and answers Flight
Recorder requests (``flight.py``). Standard library only in the rank, and torch only when the job
imported it already. The sidecar reads what it publishes through ``state_reader.py``,
``statefile.py``, ``flight.py``, ``identity.py`` and ``versions.py``; nothing outside this package
imports its in-rank machinery (runtime, wrappers, hooks), except the ones that start or load it
(``run/inject.py``, the doctor).

May import: ``model``, ``redact``, ``engines`` (which engine's code created a world).
"""
