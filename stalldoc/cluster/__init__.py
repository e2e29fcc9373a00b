"""Many nodes, one job: each node's watcher publishes a small summary in the shared run directory
and reads the others' (``summary.py``, ``publish.py``, ``probes/peers.py``, ``view.py``)."""
