"""Many nodes, one job: each node's watcher publishes a small summary in the shared run directory
(``summary.py`` the format, ``publish.py`` the writer) and reads the others' (``peers.py``, the
reader; ``view.py``, what they say about the job's ranks). The sidecar's node in the cluster,
which runs these each tick, is ``sidecar/cluster.py``.

A stage. May import: ``model``, ``analysis``, ``detect``, ``launch`` (to read files safely),
``private_files``; never a process package (relay, sidecar, agent's runtime) or ``run``.
"""
