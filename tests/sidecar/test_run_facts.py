"""The run's facts beside its ticks: watch's exit code and who ended the job are stored once the
relay told them (never when it was killed: no code reached the shell from it)."""
from __future__ import annotations

from support import run_meta, watcher_parts


def test_watchs_exit_code_is_stored_only_as_the_relay_told_it(tmp_path):
    told = {"watch_exit_code": "130", "ended_by": "interrupt"}
    for run, link in (("told", told), ("relay-killed", {})):
        with watcher_parts(tmp_path / run, gpus=False, agent=False) as watcher:
            if link:
                watcher.link.watch_code = int(link["watch_exit_code"])
                watcher.link.ended_by = link["ended_by"]
            watcher.run_facts.store_exit_codes()
        meta = run_meta(tmp_path / run)
        assert {key: meta[key] for key in told if key in meta} == link
