"""Lines in which Ray says the cluster will not grow for a request of the job: no node type of the
cluster can hold it (its autoscaler's ``Error: No available node types can fulfill resource
request {...}``, printed to the driver while it waits). A placement group Ray's state calls
INFEASIBLE may wait for a node an autoscaler is launching (minutes, nothing of the job working
meanwhile); once the autoscaler says this, no node is coming for it."""
from __future__ import annotations

import re

_DICT = r"\{[^{}]*\}"
INFEASIBLE_REQUEST = (r"No available node types can fulfill resource request "
                      r"(?:defaultdict\(<class 'float'>, )?(?P<request>" + _DICT + ")")
_INFEASIBLE = re.compile(INFEASIBLE_REQUEST)


def unplaceable(text: str) -> bool:
    """Whether the line says no node type of the cluster can hold a request of the job."""
    return "No available node types" in text and _INFEASIBLE.search(text) is not None
