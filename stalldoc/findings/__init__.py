"""A stage of the sidecar (and of ``check``): findings in a run, their life
(``ledger.py``), events seen again (``events.py``) and their one serialized shape
(``record.py``), shared by the store, ``check --format json``, the metrics and the text
renderers.

May import: ``model``.
"""
