"""stalldoc: why did my distributed training job stop making progress?

Only the agent's public API lives here, and it imports nothing outside the standard library:
this package is also imported inside every rank of a watched job.
"""
from stalldoc.agent.phase import phase

__all__ = ["phase", "__version__"]
__version__ = "0.1.0"
