"""stalldoc at a short stall timeout (10 s): how fast it can speak, and what that costs."""
from arms.stalldoc import Stalldoc

ARM = Stalldoc("stalldoc_short", 10.0)
