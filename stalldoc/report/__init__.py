"""``stalldoc report``: the post-mortem, built from the run database only (``read.py``
into the records of ``records.py``, ``document.py`` the JSON), one module per format behind one
small interface (``formats/``: text, JSON, markdown, HTML, Perfetto). The sidecar renders its
findings' lines with ``text.py``.

May import: ``model``, ``store``, ``findings``, ``analysis``, ``detect``, ``errors``, ``redact``,
``stalldoc`` (its version).
"""
