"""A stage of the sidecar: stall detection. Per rank, the evidence of work at each tick
(``work.py``, ``stack_kind.py``), progress and its absence (``progress.py``), adaptive thresholds
(``thresholds.py``), vLLM engines' sleep state from their log lines.

May import: ``model``, ``agent`` (the state file's records), ``engines`` (each rollout
engine's wait frames).
"""
