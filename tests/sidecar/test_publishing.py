"""What the watch publishes: the exporter keeps each GPU's peak memory over the run's ticks and
names the run by the shared run directory of a multi-node job (the node by its own), where the
other nodes' watchers meet (said, and stored); the status line counts from the job's start."""
from __future__ import annotations

import json
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from support import free_port, idle_host, run_meta, synthetic_tick, watcher_parts


def _scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_the_peaks_the_run_and_where_the_nodes_meet(tmp_path):
    shared, port = tmp_path / "shared", free_port()
    with watcher_parts(shared / "node-1", gpus=False, agent=False, metrics_port=port,
                       shared_dir=shared, node="node-1", node_index=1, nnodes=2) as watcher:
        publisher = watcher.publisher
        publisher.open_exporter()
        # WHEN ticks see each GPU's memory go up and down
        ticks = [synthetic_tick(float(t), ranks=2, gpus=2, phase="rollout", seed=t)
                 for t in range(1, 6)]
        for tick in ticks:
            publisher.publish(tick.t, tick)
        # THEN the exporter serves each GPU's most, and the run by the shared directory's name
        peaks = {g.index: max(t.gpus[g.index].memory_used for t in ticks) for g in ticks[0].gpus}
        assert peaks != {g.index: g.memory_used for g in ticks[-1].gpus}   # not the last tick's
        scraped = _scrape(port)
        assert {int(s.labels["gpu"]): s.value
                for s in scraped["stalldoc_gpu_memory_peak_bytes"]} == peaks
        [info] = scraped["stalldoc_run_info"]
        assert (info.labels["run_id"], info.labels["node_name"]) == (shared.name, "node-1")
        # WHEN the watch starts: it says where the other nodes' watchers meet, and stores it
        publisher.say_cluster()
        [said] = watcher.link.said()
        assert said.startswith(f"{watcher.sources.cluster.label} of 2: the other nodes' "
                               f"watchers meet in {shared}")
    stored = json.loads(run_meta(shared / "node-1")["cluster"])
    assert (stored["node"], stored["index"], stored["nnodes"], stored["shared_dir"]) == (
        "node-1", 1, 2, str(shared))


def test_the_status_line_says_each_rank_the_tracker_follows(tmp_path):
    with watcher_parts(tmp_path / "run", gpus=False, agent=False) as watcher:
        tracker = watcher.tracker
        for t in (1.0, 2.0):
            tracker.observe(t, {}, {r: idle_host(t, r, 100 + r) for r in (0, 1, 2)})
        tracker.mark_dead(2)
        watcher.publisher.status(2.0, 2.0 - 75)
        [line] = [m["status"] for m in watcher.link.sent if "status" in m]
        assert line.startswith("[stalldoc] 0:01:15 3 ranks ok")
        assert "r2 dead" in line and "r0 " in line and "r1 " in line
