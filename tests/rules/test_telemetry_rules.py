"""Good / bad windows for the telemetry rules (SD2xx GPU and memory, SD3xx host).

No GPU here, so the GPU windows are generated from the physics each rule's docstring describes
(rates x seconds, utilisation, allocator counters, CUDA marker ages), as NVML and the agent would
report them; the host windows likewise from psutil's quantities. Each window says which case it
is in its name."""
from __future__ import annotations

import dataclasses

from stalldoc.model.agent import AgentSnapshot, CudaState, PhaseRecord
from stalldoc.model.findings import Severity
from stalldoc.model.ranks import RankProcess
from stalldoc.model.samples import GpuProcess, GpuSample, HostMemory, HostSample
from stalldoc.model.window import Window
from stalldoc.model.work import RankWork, StallEpisode
from stalldoc.rules import by_code, run_rules

GiB = 2**30
NOW = 1000.0


def snapshot(rank: int, phases: tuple[PhaseRecord, ...] = (), cuda: CudaState | None = None,
             stack: tuple[str, ...] = ()) -> AgentSnapshot:
    return AgentSnapshot(100 + rank, rank, rank, 2, 0, 0.0, NOW, 1, NOW, None, stack, "",
                         len(phases), phases, (), cuda)


def cuda(host: int = 10, gpu: int = 10, pending_at: float = 0.0, retries: int = 0,
         allocated: int = 30 * GiB, reserved: int = 32 * GiB) -> CudaState:
    return CudaState(allocated, reserved, allocated, retries, 0, NOW, host, gpu,
                     f"all_reduce#{host}", f"phase m{gpu}", NOW, pending_at)


def gpu_history(rank: int, util: int, rx_bps: float, used: int = 60 * GiB,
                seconds: int = 20, compute: float | None = None) -> tuple[GpuSample, ...]:
    return tuple(GpuSample(NOW - seconds + i, 0, "GPU-0", "H100", used, 80 * GiB, util, 10,
                           rx_bps / 4, rx_bps, 400.0, (GpuProcess(100 + rank, used, rank),),
                           compute)
                 for i in range(seconds + 1))


def node_history(available: int, swap_bps: float = 0.0, load: float = 1.0,
                 cores: int = 4, running: int | None = None) -> tuple[HostMemory, ...]:
    return tuple(HostMemory(NOW - 20 + i, available, 256 * GiB, swap_bps, swap_bps, load, cores,
                            running) for i in range(21))


def host(rank: int, cpu_percent: float = 50.0, rss: int = 20 * GiB) -> tuple[HostSample, ...]:
    return (HostSample(NOW - 20, rank, 100 + rank, 1.0, rss // 2, 40, "running", 0, cpu_percent),
            HostSample(NOW, rank, 100 + rank, 9.0, rss, 40, "running", 0, cpu_percent))


def window(**kw) -> Window:
    ranks = (RankProcess(0, 100, 0, ("python",)), RankProcess(1, 101, 1, ("python",)))
    return Window(NOW, ranks, **kw)


def codes(code: str, w: Window) -> list:
    return list(by_code(code)().check(w))


def steps(offload: float, compute: float, count: int = 6) -> tuple[PhaseRecord, ...]:
    out, t = [], NOW - count * (offload + compute)
    for _ in range(count):
        out += [PhaseRecord("offload_model", t, t + offload),
                PhaseRecord("compute", t + offload, t + offload + compute)]
        t += offload + compute
    return tuple(out)


def test_sd201_bad_pcie_busy_gpu_idle():
    # 6 GiB/s host->GPU for 20 s while the GPU is 5 % busy: weights shuttling, no compute
    [f] = codes("SD201", window(gpus={0: gpu_history(0, util=5, rx_bps=6 * GiB)}))
    assert f.ranks == (0,) and f.evidence["pcie_bound"]
    assert f.evidence["pcie_rx_bytes"] == 120 * GiB and f.evidence["util_gpu_mean"] == 5


def test_sd201_good_pcie_busy_gpu_busy():
    # the same traffic overlapped with 85 % compute (prefetching ZeRO-3): not thrash
    assert codes("SD201", window(gpus={0: gpu_history(0, util=85, rx_bps=6 * GiB)})) == []


def test_sd201_bad_h100_copies_read_as_full_utilisation_but_no_kernel_ran():
    # what an H100 (driver 580) showed for pinned host->GPU copies at 55 GiB/s: NVML's
    # utilisation 100 %, GPM's graphics engine 0 %: the GPU only copies
    [f] = codes("SD201", window(gpus={0: gpu_history(0, util=100, rx_bps=55 * GiB, compute=0.0)}))
    assert f.evidence["pcie_bound"] and f.evidence["util_compute_mean"] == 0.0
    assert "ran kernels 0% of the time (NVML utilisation 100%, copies included)" in f.summary


def test_sd201_good_h100_copies_overlapped_with_kernels():
    gpus = {0: gpu_history(0, util=100, rx_bps=55 * GiB, compute=85.0)}
    assert codes("SD201", window(gpus=gpus)) == []


def test_sd201_bad_phases_dominated_by_offload_no_gpu_needed():
    # 3 s offload + 1 s compute per step: 75 % of the time moving weights
    agents = {1: snapshot(1, steps(offload=3.0, compute=1.0))}
    [f] = codes("SD201", window(agents=agents))
    assert f.ranks == (1,) and f.evidence["offload_phase_share"] == 0.75
    assert f.evidence["offload_phases"] == ["offload_model"]


def test_sd201_good_short_offload():
    assert codes("SD201", window(agents={1: snapshot(1, steps(offload=0.2, compute=3.0))})) == []


def test_sd202_bad_retries_rising():
    history = {0: tuple((NOW - 20 + i, cuda(retries=3 + i // 5)) for i in range(21))}
    [f] = codes("SD202", window(cuda=history, gpus={0: gpu_history(0, 50, 0.0, used=78 * GiB)}))
    assert f.evidence["alloc_retries"] == [3, 7] and "4 allocation retries" in f.summary


def test_sd202_bad_fragmented_and_full():
    history = {0: ((NOW, cuda(allocated=40 * GiB, reserved=70 * GiB)),)}
    [f] = codes("SD202", window(cuda=history, gpus={0: gpu_history(0, 50, 0.0, used=76 * GiB)}))
    assert "reserved 70.0 GiB for 40.0 GiB allocated" in f.summary


def test_sd202_good_steady_allocator():
    history = {0: tuple((NOW - 20 + i, cuda(retries=3)) for i in range(21))}
    assert codes("SD202", window(cuda=history, gpus={0: gpu_history(0, 50, 0.0)})) == []


def test_sd203_bad_gpu_busy_behind_for_40s():
    agents = {0: snapshot(0, cuda=cuda(host=12, gpu=11, pending_at=NOW - 40))}
    [f] = codes("SD203", window(agents=agents, gpus={0: gpu_history(0, util=100, rx_bps=0)}))
    assert f.evidence["gpu_behind_seconds"] == 40 and "GPU busy at 100%" in f.summary
    assert "host at marker 12 all_reduce#12, GPU done up to 11 phase m11" in f.summary


def waiting(kind: str) -> RankWork:
    return RankWork(NOW, "idle", kind, False, 101.0, 0, None, 0.0, 100, kind,
                    "kernel_hang (gpu_job.py:69)")


def test_sd203_bad_kernel_launched_after_the_last_marker_never_ends():
    # what the H100 showed for torch.cuda._sleep(10**13); torch.cuda.synchronize() in a phase:
    # the GPU reached every marker (the phase's own, before the kernel), the host waits in the
    # synchronize, GPU at 100 %
    agents = {0: snapshot(0, cuda=cuda(host=5, gpu=5))}
    [f] = codes("SD203", window(agents=agents, gpus={0: gpu_history(0, util=100, rx_bps=0)},
                                work={0: waiting("waiting: cuda sync")}, last_progress={0: NOW - 15}))
    assert f.evidence["host_waits_in_cuda_sync"] and f.evidence["gpu_behind_seconds"] == 15
    assert "GPU busy at 100%, the host has waited 15 s in a CUDA synchronisation" in f.summary


def test_sd203_good_all_markers_done_and_the_host_waits_elsewhere_or_briefly():
    agents = {0: snapshot(0, cuda=cuda(host=5, gpu=5))}
    gpus = {0: gpu_history(0, util=100, rx_bps=0)}
    for work, since in ((waiting("waiting: collective"), 15), (waiting("waiting: cuda sync"), 4)):
        w = window(agents=agents, gpus=gpus, work={0: work}, last_progress={0: NOW - since})
        assert codes("SD203", w) == []


def test_sd203_good_gpu_just_behind():
    agents = {0: snapshot(0, cuda=cuda(host=12, gpu=11, pending_at=NOW - 2))}
    assert codes("SD203", window(agents=agents, gpus={0: gpu_history(0, 100, 0)})) == []


def test_sd204_bad_gpu_idle_host_blocked_and_fallback_still_runs():
    agents = {0: snapshot(0, cuda=cuda()), 1: snapshot(1, cuda=cuda())}
    gpus = {0: gpu_history(0, util=0, rx_bps=0)}
    stall = StallEpisode(1, NOW - 60, NOW, 30.0, (0, 1))
    w = window(agents=agents, gpus=gpus, stall=stall, last_progress={0: NOW - 60, 1: NOW - 60})
    [f] = codes("SD204", w)
    assert f.ranks == (0,) and f.severity is Severity.INFO
    found = {f.code for f in run_rules(w, "stall")}
    assert found == {"SD204", "SD106"}       # info alone does not silence the fallback


def test_sd204_good_gpu_busy():
    agents = {0: snapshot(0, cuda=cuda())}
    assert codes("SD204", window(agents=agents, gpus={0: gpu_history(0, 80, 0)})) == []


def test_sd301_bad_low_memory_and_swapping():
    [low] = codes("SD301", window(node=node_history(available=3 * GiB), host={0: host(0)}))
    assert "3.0 GiB of 256.0 GiB available" in low.summary
    [swap] = codes("SD301", window(node=node_history(100 * GiB, swap_bps=200 * 2**20),
                                   host={0: host(0), 1: host(1, rss=40 * GiB)}))
    assert swap.ranks == (0, 1) and swap.evidence["rss_first_last"]["1"] == [20 * GiB, 40 * GiB]


def test_sd301_good():
    assert codes("SD301", window(node=node_history(120 * GiB), host={0: host(0)})) == []


def test_sd302_bad_job_saturates_and_queue_is_long():
    w = window(node=node_history(100 * GiB, load=9.0, cores=4),
               host={0: host(0, cpu_percent=200), 1: host(1, cpu_percent=190)})
    [f] = codes("SD302", w)
    assert f.evidence["load1"] == 9.0 and f.evidence["job_cpu_percent"] == 390


def test_sd302_good_a_busy_neighbour_is_not_the_job():
    w = window(node=node_history(100 * GiB, load=9.0, cores=4),
               host={0: host(0, cpu_percent=30), 1: host(1, cpu_percent=20)})
    assert codes("SD302", w) == []


def test_sd302_good_a_load_average_still_high_from_a_neighbour_that_ended():
    # the 1-minute load average lags: a CPU burner that stopped seconds ago still counts in it,
    # while only the job's 2 threads are runnable now
    w = window(node=node_history(100 * GiB, load=9.0, cores=4, running=2),
               host={0: host(0, cpu_percent=200), 1: host(1, cpu_percent=190)})
    assert codes("SD302", w) == []


def test_sd302_bad_runnable_threads_now():
    w = window(node=node_history(100 * GiB, load=1.0, cores=4, running=12),
               host={0: host(0, cpu_percent=200), 1: host(1, cpu_percent=190)})
    [f] = codes("SD302", w)
    assert f.evidence["running"] == 12 and "load 12.0 on 4 cores" in f.summary



def _with_engine(samples: tuple[HostSample, ...], cpu: float) -> tuple[HostSample, ...]:
    return tuple(dataclasses.replace(s, engine_cpu_percent=cpu) for s in samples)


def test_sd302_bad_the_ranks_own_vllm_engines_fill_the_cores():
    # two training ranks at 10 % each, their colocated engines' processes spinning at 95 %:
    # the job itself saturates the 2 cores, though its ranks' own CPU is low
    w = window(node=node_history(100 * GiB, load=1.0, cores=2, running=6),
               host={0: _with_engine(host(0, cpu_percent=10), 95.0),
                     1: _with_engine(host(1, cpu_percent=10), 93.0)})
    [f] = codes("SD302", w)
    assert f.evidence["job_cpu_percent"] == 208 and f.evidence["engine_cpu_percent"] == {
        "0": 95.0, "1": 93.0}
    assert "the ranks' vLLM engines' processes use 95 % + 93 % CPU (ranks 0, 1)" in f.summary



def _run_queue(running: list[int], cores: int = 2) -> tuple[HostMemory, ...]:
    """Node samples a second apart ending now, with these runnable-thread snapshots."""
    return tuple(HostMemory(NOW - len(running) + 1 + i, 100 * GiB, 256 * GiB, 0.0, 0.0, 1.0,
                            cores, r) for i, r in enumerate(running))


def test_sd302_bad_a_long_run_queue_whose_snapshots_dip_now_and_then():
    # procs_running is a snapshot: 18-20 runnable as engines spin, 3 or 4 in the odd second
    queue = [19, 18, 3, 20, 18, 18, 22, 4, 19, 18, 20, 18, 3, 19, 18, 20, 21, 18, 19, 18]
    w = window(node=_run_queue(queue), host={0: _with_engine(host(0, cpu_percent=8), 90.0),
                                             1: _with_engine(host(1, cpu_percent=8), 85.0)})
    [f] = codes("SD302", w)
    assert f.evidence["running"] == 18 and f.evidence["load_median"] == 18.0
    assert "load 18.0 on 2 cores for 19 s" in f.summary, f.summary


def test_sd302_good_a_run_queue_long_only_for_a_burst():
    # a compile or a checkpoint's threads: a third of the window overloaded, then not
    queue = [19, 18, 20, 18, 18, 22, 19, 3, 2, 3, 2, 2, 3, 2, 2, 3, 2, 2, 3, 2]
    w = window(node=_run_queue(queue), host={0: _with_engine(host(0, cpu_percent=8), 90.0),
                                             1: _with_engine(host(1, cpu_percent=8), 85.0)})
    assert codes("SD302", w) == []

def test_sd302_good_engines_that_leave_cores_free():
    w = window(node=node_history(100 * GiB, load=1.0, cores=8, running=18),
               host={0: _with_engine(host(0, cpu_percent=10), 95.0),
                     1: _with_engine(host(1, cpu_percent=10), 93.0)})
    assert codes("SD302", w) == []

def test_a_quiet_window_has_no_tick_findings():
    w = window(node=node_history(120 * GiB), host={0: host(0), 1: host(1)},
               gpus={0: gpu_history(0, 60, 0.5 * GiB)},
               agents={0: snapshot(0, steps(0.2, 3.0), cuda()), 1: snapshot(1)},
               cuda={0: ((NOW, cuda()),)})
    assert run_rules(w, "tick") == []


def gpu(index: int, util: int, procs: tuple[GpuProcess, ...], t: float) -> GpuSample:
    return GpuSample(t, index, f"GPU-{index}", "H100", 40 * GiB if procs else 0, 80 * GiB, util,
                     10, 0.0, 0.0, 300.0, procs)


def node_gpus(layout: dict[int, tuple[int, tuple[GpuProcess, ...]]]) -> dict:
    return {i: tuple(gpu(i, util, procs, NOW - 20 + s) for s in range(21))
            for i, (util, procs) in layout.items()}


def test_sd205_bad_two_ranks_on_one_gpu():
    # rank 0 and rank 1's vLLM worker (pid 555, a child of rank 1) on GPU 0
    gpus = node_gpus({0: (90, (GpuProcess(100, 20 * GiB, 0), GpuProcess(555, 30 * GiB, 1))),
                      1: (0, ())})
    [f] = codes("SD205", window(gpus=gpus))
    assert f.ranks == (0, 1) and f.evidence["processes"] == {"100": 0, "555": 1}


def test_sd205_good_a_rank_and_its_own_worker():
    gpus = node_gpus({0: (90, (GpuProcess(100, 20 * GiB, 0), GpuProcess(556, 30 * GiB, 0)))})
    assert codes("SD205", window(gpus=gpus)) == []


def test_sd206_bad_half_the_gpus_unused():
    # NPROC_PER_NODE=2 on a 4-GPU node: GPUs 2 and 3 never get a process
    gpus = node_gpus({0: (95, (GpuProcess(100, GiB, 0),)), 1: (93, (GpuProcess(101, GiB, 1),)),
                      2: (0, ()), 3: (0, ())})
    [f] = codes("SD206", window(gpus=gpus))
    assert f.evidence["idle_gpus"] == [2, 3] and "2 ranks on 4 GPUs" in f.summary


def test_sd206_good_every_gpu_used_or_job_idle():
    every = node_gpus({0: (95, (GpuProcess(100, GiB, 0),)), 1: (93, (GpuProcess(101, GiB, 1),))})
    assert codes("SD206", window(gpus=every)) == []
    starting = node_gpus({0: (0, (GpuProcess(100, GiB, 0),)), 1: (0, ())})  # loading, not busy
    assert codes("SD206", window(gpus=starting)) == []
