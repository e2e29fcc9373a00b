"""A stage of the sidecar: what a stall looks like across ranks (stack groups, culprit
frames, collective alignment, Flight Recorder dumps, teardown and watchdog traces), from the
records the probes and the detector made.

May import: ``model``, ``detect`` (stack kinds), ``agent`` (the state file's records),
``engines`` (what each rollout engine's frames are).
"""
