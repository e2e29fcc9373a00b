"""Many nodes, one job: each node's watcher publishes a small summary in the shared run directory
(``summary.py`` the format, ``publish.py`` the writer) and reads the others' (``peers.py``, the
reader; ``view.py``, what they say about the job's ranks). The sidecar's node in the cluster,
which runs these each tick, is ``sidecar/cluster.py``. Watches beside each other (a rollout
server's and its trainer's) meet the same way, through a card in each run directory
(``peer_card.py``).

A stage. May import: ``model``, ``analysis``, ``detect``, ``launch`` (to read files safely),
``private_files``, ``redact`` (what another watch's card quotes is redacted again); never a process package (relay, sidecar, agent's runtime) or ``run``.
"""
