"""A stage: what the launch command says before anything starts. The command line and
its environment (``config.py``, ``arguments.py``), the node's GPUs, dataset and model files
(``resources.py``, read safely by ``files.py``), the GRPO arithmetic (``plan.py``) and what the
checks covered (``coverage.py``). Used by ``check``, the launch rules and the sidecar before the
job starts.

May import: ``model``, ``errors`` (to keep a message that repeats the user's paths one line).
"""
