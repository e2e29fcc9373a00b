"""A stage of the sidecar: the run directory's SQLite database (``db.py`` writes,
``reader.py`` opens for reading, ``schema.py``, ``retention.py`` keeps it bounded).

May import: ``model``, ``findings``, ``errors``, ``redact``.
"""
