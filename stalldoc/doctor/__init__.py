"""``stalldoc doctor``: will ``watch`` see anything on this node, for this command? One check per
module, each a function returning ``Check`` values (``model.py``); ``run.py`` runs them and
renders the lines or the JSON. Nothing here imports torch: what the job's interpreter has is read
in short-lived children of that interpreter."""
