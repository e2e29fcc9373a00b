"""The progress model: is each rank working, and is the job stalled?

Each tick, every rank's evidence of work (``detect.work``) gives a verdict. The job is stalled
when no live rank showed work for longer than the threshold (the floor, raised for phases seen to
take long). A working rank without progress is slow, not stuck. Busy ranks get their stack
classified (``stacks_due`` / ``stack_seen``): CPU spent spinning in a wait is not work.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from stalldoc.model.agent import AgentSnapshot
from stalldoc.detect.stack_kind import BETWEEN_TASKS, StackKind, classify
from stalldoc.detect.thresholds import PhaseDurations
from stalldoc.detect.work import IDLE, PENDING, WORK, RecentRate, Signals, verdict
from stalldoc.model.ranks import RankExit
from stalldoc.model.samples import HostSample
from stalldoc.model.stacks import RankStacks
from stalldoc.model.work import RankWork, StallEpisode


STACK_DECIDES = frozenset({"unclassified", "stack", "spinning"})   # verdicts a stack decided
ENDING_GRACE = 30.0   # a rank whose process is ending decides no stall for this long at least


def resample_every(floor: float) -> float:
    """How often a busy rank's stack is classified again: a quarter of the floor, 2-15 s."""
    return min(15.0, max(2.0, floor / 4))


def hold_for(floor: float) -> float:
    """How long a rank that showed work a moment ago is still called working (not counted as
    work for the stall decision, which has its own threshold): 2-10 s."""
    return min(10.0, max(2.0, floor / 4))


@dataclass
class _Rank:
    last_progress: float
    last_work: float                  # work or pending: no stall can start before it
    last_confirmed: float             # work only: ends a stall
    counters: tuple[int, ...] = ()
    phase: str = ""
    phase_stack: str = ""
    phase_thread: int = 0             # the thread that entered the innermost phase (0: unknown)
    stack: StackKind | None = None
    stack_at: float = 0.0
    last_busy_at: float = 0.0
    busy_since: float | None = None    # this busy spell (short pauses included) began
    unchanged_since: float | None = None   # busy in one working stack, nothing else moving
    unchanged_shape: tuple = ()        # the deciding thread and its functions (per thread)
    work: RankWork | None = None
    basis: str = ""                   # what decided the last verdict (work.verdict's words)
    ending_since: float | None = None  # its process was first seen ending (a zombie, or gone)
    io: RecentRate = field(default_factory=RecentRate)
    free_at: float = 0.0   # last seen with no work in hand (a server waiting for requests)


@dataclass
class ProgressTracker:
    floor: float
    ranks: dict[int, _Rank] = field(default_factory=dict)
    durations: PhaseDurations = field(default_factory=PhaseDurations)
    episode: StallEpisode | None = None
    episodes: int = 0
    dead: set[int] = field(default_factory=set)
    moved_at: float = 0.0   # the job itself was last seen to move (``job_progressed``)

    # ----- feeding ----------------------------------------------------------------------------
    def observe(self, now: float, agents: Mapping[int, AgentSnapshot],
                host: Mapping[int, HostSample], gpu_util: Mapping[int, int | None] | None = None,
                ending: Iterable[int] = (), progressed: Iterable[int] = ()) -> None:
        """Fold one tick of samples into every rank's state and verdict. ``ending``: ranks whose
        process is ending (a zombie whose threads are still torn down, or gone from the process
        table) while their exit is not on record yet. ``progressed``: ranks whose progress was
        seen outside their own agent this tick (their vLLM engine ran forward passes)."""
        progressed = set(progressed)
        ending = {r for r in ending if r in self.ranks}
        for rank in ending:
            state = self.ranks[rank]
            state.ending_since = now if state.ending_since is None else state.ending_since
        for rank in set(agents) | set(host) | ending:
            state = self.ranks.setdefault(rank, _Rank(now, now, now))
            moved = self._observe_agent(state, agents.get(rank)) or rank in progressed
            if moved:
                state.last_progress = now
            sample = host.get(rank)
            average = (state.io.add(now, sample.io_bps)
                       if sample is not None and sample.io_bps is not None else None)
            signals = Signals(moved, sample, (gpu_util or {}).get(rank), average)
            self._judge(now, state, signals)

    def _observe_agent(self, state: _Rank, agent: AgentSnapshot | None) -> bool:
        """Whether the agent's counters moved since the last tick."""
        if agent is None:
            return False
        self.durations.update(agent.rank, agent.phases_completed, agent.phases)
        state.phase = agent.phase
        state.phase_stack = "/".join(agent.phase_stack)
        state.phase_thread = agent.phase_thread
        cuda = agent.cuda.gpu_marker if agent.cuda is not None else 0
        # c10d_issued: collectives issued from C++ (DDP's reducer), which the rings never see
        counters = (agent.marker_seq, sum(g.started for g in agent.groups),
                    agent.collective_seq, cuda, agent.c10d_issued)
        moved = bool(state.counters) and counters != state.counters
        state.counters = counters
        return moved

    def _judge(self, now: float, state: _Rank, signals: Signals) -> None:
        if signals.busy:
            state.last_busy_at = now
            state.busy_since = now if state.busy_since is None else state.busy_since
        elif now - state.last_busy_at > resample_every(self.floor):
            state.busy_since = None   # a new busy spell may run other code: classify it afresh
        result, basis, reason = verdict(signals, self._busy_stack(state))
        if state.ending_since is not None:
            result, basis = IDLE, "exiting"
            reason = f"exiting for {now - state.ending_since:.0f} s (its process is ending)"
        elif result == IDLE and basis == "quiet" and state.work is not None \
                and now - state.last_confirmed <= hold_for(self.floor):
            # work comes in bursts (a 4 MB write is counted when it returns): hold the verdict,
            # without counting it as new work
            result, basis = WORK, "held"
            reason = f"{state.work.reason.split(' (')[0]} ({now - state.last_confirmed:.0f} s ago)"
        elif result in (WORK, PENDING):
            state.last_work = now
            if result == WORK:
                state.last_confirmed = now
        self._track_unchanged(now, state, signals, basis)
        state.basis = basis
        host = signals.host
        fresh = now - state.stack_at <= 2 * resample_every(self.floor)
        stack = state.stack if fresh else None      # an old stack says nothing of now
        state.work = RankWork(
            now, result, reason, signals.progressed, host.cpu_percent if host else None,
            host.children if host else 0, host.children_cpu_percent if host else None,
            host.io_bps if host else None, signals.gpu_util, stack.kind if stack else "",
            str(stack.frame) if stack and stack.frame else "", round(now - state.last_progress, 1),
            round(now - state.unchanged_since, 1) if state.unchanged_since is not None else 0.0,
            host.cpu_wait_percent if host else None)

    @staticmethod
    def _busy_stack(state: _Rank) -> StackKind | None:
        """The stack classified during this busy spell (an older one may be other code)."""
        if state.busy_since is None or state.stack_at < state.busy_since:
            return None
        return state.stack

    def _track_unchanged(self, now: float, state: _Rank, signals: Signals, basis: str) -> None:
        """Busy in one working stack with no progress, I/O, children or GPU: the livelock clock."""
        stack = state.stack
        only_cpu = (basis == "stack" and not signals.gpu_util and stack is not None
                    and (signals.host is None or not signals.host.children))
        if not only_cpu or stack is None or stack.signature != state.unchanged_shape:
            state.unchanged_since = now if only_cpu else None
            state.unchanged_shape = stack.signature if only_cpu and stack is not None else ()

    def stack_seen(self, rank: int, stacks: RankStacks, now: float) -> None:
        """A stack sample of a busy rank: classify it (working or waiting, and on what)."""
        state = self.ranks.get(rank)
        kind = classify(stacks, state.phase_thread if state is not None else 0)
        if state is None or not kind.kind:
            return
        state.stack, state.stack_at = kind, now

    def job_progressed(self, now: float) -> None:
        """The job itself reported progress (a logged training step that every rank took part
        in): every live rank counts as progressing."""
        self.moved_at = max(self.moved_at, now)
        for rank, state in self.live().items():
            state.last_progress = state.last_work = state.last_confirmed = now

    def forget(self, rank: int) -> None:
        """A new process holds this rank: start its history afresh."""
        self.ranks.pop(rank, None)
        self.dead.discard(rank)

    def mark_dead(self, rank: int) -> None:
        self.dead.add(rank)

    # ----- reading ----------------------------------------------------------------------------
    def stacks_due(self, now: float, executors: Iterable[int] = ()) -> list[int]:
        """Ranks whose stack should be sampled now: busy ones whose verdict waits on it (no
        progress, I/O or children's work decided it) and that were not classified in this busy
        spell or not for a while (is the CPU work or a spinning wait?), ranks working without
        progress for half the floor (where are they slow?), and quiet ranks of a task executor
        (``executors``: Ray workers) not sampled for a while (between tasks, or stuck in one?).
        A busy rank whose markers or collectives move is not sampled: the stack would decide
        nothing."""
        every, executors = resample_every(self.floor), set(executors)
        due = []
        for rank, s in self.live().items():
            if s.work is None or s.work.t != now:
                continue
            stale = now - s.stack_at >= every
            busy = (s.last_busy_at == now and s.basis in STACK_DECIDES
                    and (self._busy_stack(s) is None or stale))
            slow = s.work.working and s.work.since_progress >= self.floor / 2 and stale
            waiting = rank in executors and s.work.verdict == IDLE and stale
            if busy or slow or waiting:
                due.append(rank)
        return due

    def between_tasks(self, now: float) -> set[int]:
        """Live ranks with no work in hand: idle, and their stack idles in a task executor's
        loop (``BETWEEN_TASKS``). Their next task comes from the job's driver. The stack is a
        fresh one, or the one of the rank's busy spell, which its verdict rests on (a rank
        starved of CPU in that loop is idle by that stack until the next one is classified,
        seconds later on a loaded node: it cannot also be taken for a rank in a task)."""
        fresh = 2 * resample_every(self.floor)
        return {r for r, s in self.live().items()
                if s.stack is not None and s.stack.kind == BETWEEN_TASKS
                and (now - s.stack_at <= fresh or self._busy_stack(s) is not None)
                and s.work is not None and s.work.verdict == IDLE}

    def in_task(self, now: float) -> set[int]:
        """Live ranks seen with work in hand: working, or a fresh stack in anything but a task
        executor's idle loop (a collective, a rendezvous). A rank not read lately is in neither
        this set nor ``between_tasks``: nothing is known of it."""
        fresh = 2 * resample_every(self.floor)
        return {r for r, s in self.live().items()
                if (s.work is not None and s.work.working) or (
                    s.stack is not None and s.stack.kind != BETWEEN_TASKS
                    and now - s.stack_at <= fresh)}

    def ending(self, now: float) -> set[int]:
        """Live ranks whose process is ending, for no longer than the threshold and
        ``ENDING_GRACE``: a rank's last act, whose exit is recorded when its last thread is
        gone (a large process takes seconds to be torn down, longer on a loaded node). One
        ending for longer is stuck in its exit (a thread in the kernel, a driver's teardown)."""
        grace = max(self.threshold(), ENDING_GRACE)
        return {r for r, s in self.live().items()
                if s.ending_since is not None and now - s.ending_since <= grace}

    def live(self) -> dict[int, _Rank]:
        return {r: s for r, s in self.ranks.items() if r not in self.dead}

    def work(self) -> dict[int, RankWork]:
        """Each live rank's latest verdict and the evidence behind it."""
        return {r: s.work for r, s in sorted(self.live().items()) if s.work is not None}

    def threshold(self) -> float:
        """The floor, raised for the slowest phase any live rank is in now."""
        return max([self.floor] + [self.durations.threshold(s.phase, self.floor)
                                   for s in self.live().values()])

    def ages(self, now: float) -> dict[int, tuple[float, float]]:
        """Each rank's seconds since it last showed work, and since its counters last moved."""
        return {r: (round(now - s.last_work, 2), round(now - s.last_progress, 2))
                for r, s in self.ranks.items()}

    def phases(self) -> dict[int, str]:
        return {r: s.phase for r, s in self.ranks.items()}

    def quiet_for(self, now: float) -> float:
        """Seconds since any live rank of this node showed work (0 with none)."""
        live = self.live()
        return now - max(s.last_work for s in live.values()) if live else 0.0

    def last_progress(self) -> dict[int, float]:
        """Each rank's last progress, or the last time it had no work in hand if later (a
        server's time without progress counts from its request)."""
        return {r: max(s.last_progress, s.free_at) for r, s in self.ranks.items()}

    # ----- the decision -----------------------------------------------------------------------
    def check(self, now: float, elsewhere_at: float | None = None, elsewhere_now: bool = False,
              awaiting: Iterable[int] = (), outside_quiet: float | None = None
              ) -> tuple[StallEpisode | None, StallEpisode | None]:
        """(a stall that starts now, a stall that ended now): at most one is not None.
        Ranks between tasks (``between_tasks``) have no work in hand and decide nothing, nor
        do ranks whose process is ending (``ending``) until it has taken longer than the
        threshold and ``ENDING_GRACE``; with no other rank, nothing is stalled.
        ``elsewhere_at``: the last work seen on the job's other nodes (our clock); while a rank
        there works this node's waiting ranks are not stalled, and ``elsewhere_now`` (a rank
        there works now) ends a stall. ``awaiting``: ranks that serve requests and whose engine
        waits for them: no work in hand either, their clients' turn. ``outside_quiet``: when
        every rank waits between tasks, since when the part of the job that hands them their
        work (a Ray driver, its actors: ``sidecar/ray_job.py``) has shown none either (None:
        it works, or there is none); then the job itself is stalled once that is longer than
        the threshold; a job with no rank known (a Ray driver whose actors run in a cluster
        started apart) is stalled on that alone."""
        live = self.live()
        if not live and (self.ranks or (outside_quiet is None and self.episode is None)):
            return None, None   # every rank ended; or no rank known, and nothing else quiet
        if self.episode is not None:
            return None, self._ended(now, live, elsewhere_now)
        awaiting = set(awaiting) & set(live)
        for rank in awaiting:   # its stall clock starts when a request comes
            live[rank].free_at = now
        idle = self.between_tasks(now) | self.ending(now) | awaiting
        in_task = [s for r, s in live.items() if r not in idle]
        if not in_task and outside_quiet is None:
            return None, None   # no rank has work in hand: the driver's turn, not a stall
        newest = max([max(s.last_work, s.free_at) for s in in_task]
                     + ([outside_quiet] if not in_task else [])
                     + ([elsewhere_at] if elsewhere_at is not None else []))
        threshold = self.threshold()
        if now - newest <= threshold:
            return None, None
        self.episodes += 1
        ranks = sorted(live)
        self.episode = StallEpisode(
            self.episodes, newest, now, threshold, tuple(ranks),
            phases={r: live[r].phase_stack for r in ranks},
            work={r: live[r].work for r in ranks if live[r].work is not None},
            outside=not in_task)
        return self.episode, None

    def _ended(self, now: float, live: Mapping[int, _Rank], elsewhere_now: bool
               ) -> StallEpisode | None:
        episode = self.episode
        assert episode is not None
        confirmed = max([self.moved_at] + [s.last_confirmed for s in live.values()])
        if confirmed <= episode.started_at and not elsewhere_now:
            return None
        self.episode = None
        self.durations.resumed(episode.phases.values(), now - episode.started_at)
        return StallEpisode(**{**episode.__dict__, "ended_at": now})


def latest_progress(agents: Mapping[int, AgentSnapshot], exits: Iterable[RankExit]
                    ) -> dict[int, float]:
    """Each rank's latest sign of progress on record: its agent's last marker (a phase entered
    or ended, a hooked call), its last completed collective, its process groups' counters
    rising, and an exit 0 (the work it had left was done)."""
    latest: dict[int, float] = {}
    for rank, agent in agents.items():
        done = [r.completed_at for g in agent.groups for r in g.ring if r.completed_at]
        latest[rank] = max([agent.last_marker_at, agent.c10d_rose_at, *done])
    for exit in exits:
        if exit.exit_code == 0:
            latest[exit.rank] = max(latest.get(exit.rank, 0.0), exit.t)
    return latest
