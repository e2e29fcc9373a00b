"""The records passed between the parts: frozen dataclasses, one module per domain.

- ``ranks``: which processes are ranks and how each is known; how a rank ended;
- ``samples``: what the probes see each tick (host, GPU, probe runs, log lines) and the tick;
- ``agent``: what a rank's agent publishes (phases, CUDA markers, identity, vLLM engines);
- ``collectives``: the agents' rings and PyTorch's Flight Recorder dumps;
- ``stacks``: Python stacks and which thread is a rank's main one;
- ``work``: the stall decision's records (a rank's evidence of work, a stall episode);
- ``findings``: what the rules conclude;
- ``launch``: what the command line, the node and the files say before launch;
- ``cluster``: the job's other nodes;
- ``window``: what the rules see at a check (it holds all of the above).

A leaf: these modules import the standard library and each other only, never another stalldoc
module (tests/test_model.py pins it), so every part, the agent inside a rank too, can import
them without dragging another part in. Import from the domain's module
(``from stalldoc.model.findings import Finding``); this package itself exports nothing.

May import: ``model`` (its own modules) only.
"""
