"""``stalldoc doctor``: will ``watch`` see anything on this node, for this command? One
check per module, each a function returning ``Check`` values (``model.py``); ``run.py`` runs
them and renders the lines or the JSON. Nothing here imports torch: what the job's interpreter
has is read in short-lived children of that interpreter (``--gpu``: ``gpu_job.py`` under a real
``stalldoc watch``).

May import: ``run``, ``probes``, ``agent`` (to load it in a child), ``analysis``, ``store``,
``launch`` (the known version clashes), ``errors``, ``redact``, ``stalldoc``.
"""
