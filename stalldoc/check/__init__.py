"""``stalldoc check``: the launch checks of a swift command line before any GPU is touched
(``preflight.py``: parse with ``launch``, run the launch rules within a time budget; the sidecar
runs the same before the job starts), and their text form (``text.py``).

May import: ``launch``, ``rules``, ``findings``, ``probes`` (NVML, the command's interpreter's
frameworks), ``report`` (the plan's rendering), ``model``, ``errors``, ``redact``; no process
package.
"""
