"""Starting the agent in a process, what the bootstrap calls: the runtime (``runtime.py``), then
the collective wrappers once the job imports torch.distributed (``collectives.py``) and the
framework hooks (``hooks.py``). They use the runtime; the runtime knows none of them. Standard
library only."""
from __future__ import annotations

from stalldoc.agent import post_import, runtime

TYPE_CHECKING = False
if TYPE_CHECKING:
    from stalldoc.agent.runtime import Agent


def start_from_env(started: float | None = None) -> Agent | None:
    """The agent of this process, started if the watcher asked for it; never raises. Its
    wrappers and hooks are installed once, by the call that started it."""
    fresh = runtime._AGENT is None
    agent = runtime.start_from_env(started)
    if agent is None or not fresh:
        return agent
    if not runtime.feature_off("collectives"):
        post_import.when_imported("torch.distributed", _install_collectives)
    if not runtime.feature_off("hooks"):
        from stalldoc.agent import hooks
        hooks.install_all(agent)
    return agent


def _install_collectives(module: object) -> None:
    from stalldoc.agent import collectives   # only in processes that use torch.distributed
    collectives.install(module)  # type: ignore[arg-type]
