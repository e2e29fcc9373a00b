"""The thread primitives the agent uses, bound when the agent is imported: at interpreter start,
before any of the job's code has run.

A job may monkey-patch the standard library (gevent's ``monkey.patch_all()``, eventlet's
``monkey_patch()``): ``time.sleep``, ``_thread.allocate_lock``, ``_thread.get_ident`` and
``_thread.start_new_thread`` become the library's, made for its greenlets. Looked up at call
time, they would have the agent's heartbeat (a real OS thread) create a gevent hub of its own,
importing gevent's modules behind gevent's import locks while the job's main thread imports the
same: the job then deadlocked at its start, one run in about twenty (seen under watch, never
without). What the agent holds here stays what the interpreter provides, whatever the job patches
later; ``get_ident`` stays the OS thread's id, so "the main thread" keeps meaning it."""
from __future__ import annotations

import _thread
import time

sleep = time.sleep
allocate_lock = _thread.allocate_lock
get_ident = _thread.get_ident
get_native_id = _thread.get_native_id
start_new_thread = _thread.start_new_thread
