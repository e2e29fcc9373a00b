"""``stalldoc demo``: the built-in demo, a torchrun gloo job in which one rank hangs,
watched and reported.

May import: ``relay``, ``run``, ``report``, ``errors``, ``stalldoc`` (its phases).
"""
