"""Why a rank is missing from the collective the others wait in, where the evidence decides it.

A stall finding says who is missing; a cause says why, with a fix written for that cause. Each
cause is decided from evidence already collected (here: the ranks' PyTorch Flight Recorder
dumps, taken on the stall) and is None when that evidence is missing or does not decide it: the
finding then says what is known and no more.

- ``uneven_steps``: the missing rank is not stuck in its own code; it waits in a collective too,
  one DDP issued from ``backward()`` (the gradient all-reduce), at the very sequence number where
  the waiting ranks, after training steps of their own, sit in another collective (a barrier,
  an all-reduce of metrics after the loop). The ranks ran different numbers of steps: uneven
  inputs (or the waiting ranks left the loop on a branch the others did not take: the dumps
  cannot tell the two apart, and the finding says both). Waiting ranks that ran no step yet are
  not this cause (they wait in loading or set-up code).
- ``skipped_step``: the same evidence, and the job's log shows a batch skipped after an error
  (``ran out of memory, skipping this batch``, a caught exception and ``continue``): a rank that
  skips a step alone issues one gradient all-reduce fewer than the others. Which rank printed
  the line the log does not say; the finding quotes it. Skips every rank makes together (the
  fp16 loss scaler's "OVERFLOW ... skipping step") are not this.
- ``forward_on_some_ranks``: one side gathers a layer's sharded parameters for a forward (FSDP's
  unshard, ZeRO-3's fetch; not inside backward()) issued from a line the other rank never ran:
  a forward, ``generate()`` or ``summon_full_params`` on some ranks only (rank 0 samples or
  evaluates alone). Under FSDP / ZeRO-3 every forward needs every rank.
- ``forward_count_differs``: the same gather, from a line the other rank ran too before it moved
  on (to a barrier, the next phase): the ranks run different numbers of forward passes, as
  ``generate()`` without ``synced_gpus`` does when ranks stop at different lengths. Where the
  line is the training step's forward and the other rank ran steps and is out of them, it is
  ``uneven_steps``.
- ``size_mismatch``: the same collective, issued from the same line, with tensors of different
  sizes on the two ranks (an ``all_gather`` of per-rank predictions of different lengths; a
  ``broadcast_object_list`` whose lists differ in length, as its first broadcast carries one size
  per object). NCCL does not check sizes: it hangs or mixes data (gloo aborts on it instead).
- ``some_ranks_only``: one side's collective was issued where the other rank never issued one
  (no entry of its Flight Recorder comes from that line), while the other side's is on the path
  every rank takes (the first rank made it before too, or it is DDP's gradient all-reduce): a
  collective under a branch only some ranks take (``if rank == 0: ...``, a check of a file that
  only some ranks see). The frames of that call, innermost first, name the branch.
- ``collective_order``: different collectives at the same point, each issued where the other
  rank also issues collectives: the ranks call them in a different order.
- ``different_collectives``: different collectives at the same point, and the dumps hold too
  few frames to tell which of the two above: the culprit is not stuck in its own code, and the
  finding says where each side waits and no more.
- ``crossed_groups``: decided from the agents' rings, not the dumps: the ranks missing from one
  group's collective all wait in another group's, which the first's waiting ranks never
  entered. Each side waits for the other, in collectives of two groups (a colocated engine's
  TP group and the world): the ranks issue the two groups' collectives in different orders.
- ``engine_collective``: decided from the stacks, not the dumps (vLLM's shared-memory
  collectives bypass torch.distributed): the missing rank waits in its colocated vLLM engine's
  tensor-parallel collective, inside ``generate``, for the other ranks of its TP group, while
  the waiting ranks sit in the job's own collective, outside their engine. Each side waits for
  the other: the ranks of one engine did not run the same generate calls (one skipped a rollout
  the others ran, or ran one more). Neither side alone is the culprit, and the finding says so.
  The same for an engine's data-parallel replicas (``engine_group`` "data-parallel"): the
  missing rank waits in its engine's DP sync (vLLM's ``has_unfinished_dp`` after each step),
  a torch.distributed collective on the engine's DP group, for the ranks of its DP group,
  which wait outside their engine: the replicas are out of step.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from stalldoc import engines
from stalldoc.analysis.flight_recorder import op_name
from stalldoc.analysis.stacks import (in_collective, is_library, user_frame,
                                      waits_in_engine_collective, waits_in_engine_dp_sync)
from stalldoc.detect.stack_kind import frame_wait
from stalldoc.model.collectives import FlightDump, FlightEntry
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack

UNEVEN_STEPS_FIX = (
    "Give every rank the same number of batches: a DistributedSampler with drop_last=True "
    "(`--dataloader_drop_last true` for the HF Trainer, TRL and swift), or trim the data to a "
    "multiple of the world size before sharding it; where ranks must run out of data at "
    "different times, wrap the loop in `with model.join():` (DDP) or "
    "`torch.distributed.algorithms.Join`, which shadows the missing collectives of the ranks "
    "that are done. If those ranks left the loop on purpose (evaluation or a checkpoint on one "
    "rank), make every rank leave it at the same step; if a rank skips a batch on its own (an "
    "exception it caught), decide the skip on every rank together.")
SKIPPED_STEP_FIX = (
    "Decide a skip on every rank together: where one rank must skip a batch (an exception it "
    "caught, an out-of-memory, a NaN or spiking loss, a micro-batch with nothing to learn "
    "from), all_reduce a flag (ReduceOp.MAX) and let every rank skip that batch or none, so "
    "each rank's backward() issues the same gradient all-reduces; never `continue` past "
    "backward() on one rank alone. An out-of-memory inside backward() cannot be skipped safely "
    "under DDP: lower the batch or sequence length instead.")
FORWARD_COUNT_FIX = (
    "Make every rank run the same number of forward passes under FSDP / ZeRO-3: with Hugging "
    "Face generate() pass synced_gpus=True (transformers sets it for ZeRO-3, not always for "
    "FSDP), which keeps a rank that has finished running forward passes until every rank has; "
    "in a decoding loop of your own, all_reduce a 'done' flag each step and stop when every "
    "rank is done; give every rank the same number of evaluation batches.")
SIZE_MISMATCH_FIX = (
    "Give the collective tensors of the same shape on every rank: pad to a common length "
    "first (all_reduce the lengths with ReduceOp.MAX, pad, gather, then trim), or gather "
    "Python objects with all_gather_object; broadcast_object_list needs a list of the same "
    "length on every rank (e.g. [None] * n on the receivers).")
COLLECTIVE_ORDER_FIX = (
    "Make every rank call the same collectives in the same order: compare the two frames named, "
    "and find the code path (a branch on the rank or on the data) that runs them in another "
    "order on some ranks.")
CROSSED_FIX = (
    "Make every rank issue the collectives of every group in the same order: a rank that enters "
    "one group's collective (a colocated engine's tensor-parallel all-reduce inside generate, a "
    "subgroup's all_gather) while another rank of both groups is still in the other group's (a "
    "barrier or a weight sync on the world) waits for it for good. Compare the two frames named "
    "and find the branch or the order that differs; where the order cannot be the same, put a "
    "barrier of the same group before both on every rank.")
_BACKWARD_FUNCTIONS = {"_engine_run_backward", "run_backward"}
# where FSDP (1 and 2) and DeepSpeed ZeRO-3 gather sharded parameters: (path part, function names)
_SHARDED = (("FSDP", "/torch/distributed/fsdp/", ("unshard",)),
            ("ZeRO-3", "/deepspeed/runtime/zero/", ("fetch_sub_module", "all_gather")))
_OBJECT_COLLECTIVES = ("broadcast_object_list", "all_gather_object", "gather_object",
                       "scatter_object_list")
_SKIP = re.compile(r"\bskip(?:s|ped|ping)?\b", re.IGNORECASE)
_ERROR = re.compile(r"out of memory|\bOOM\b|error|exception|\bnan\b", re.IGNORECASE)
# skips every rank makes together: the fp16 loss scaler's overflow, and Megatron's counters of
# them ("number of skipped iterations: 0 | number of nan iterations: 0")
_ALL_RANKS = re.compile(r"overflow|loss.?scal|skipped iterations", re.IGNORECASE)
LOG_LINE_CHARS = 200


@dataclass(frozen=True)
class Cause:
    """A cause of a stall finding: its kind, the sentence the finding adds, its fix, its facts."""

    kind: str
    says: str
    fix: str
    facts: Mapping[str, Any]

    def evidence(self) -> dict[str, Any]:
        """The finding's ``evidence.cause``."""
        return {"kind": self.kind, "says": self.says, **self.facts}


ENGINE_FIX = (
    "The ranks of a colocated vLLM engine with tensor_parallel_size > 1 "
    "(distributed_executor_backend=\"external_launcher\": TRL's and swift's vllm_mode colocate) "
    "run every generate together: each rank of a TP group must call generate the same number "
    "of times, with the same prompts. Gather the group's prompts before generating (TRL and "
    "swift do) and let a rank with no prompts of its own still join the call, or keep "
    "vllm_tensor_parallel_size at 1 when the ranks' rollouts may differ.")


DP_ENGINE_FIX = (
    "The data-parallel replicas of a rollout engine (vLLM's data_parallel_size > 1, as verl "
    "and swift set it for a rollout of DP x TP ranks; SGLang's DP attention) step together: "
    "after or before each step a replica waits for every other to say whether it has requests "
    "left. Every DP rank must call generate as often as the others, also when its share of the "
    "prompts is empty (deal the prompts so that every rank has some, or let it generate a "
    "placeholder prompt), or give each rank an engine of its own (data_parallel_size 1).")


def colocated_tp_size(settings: Mapping[str, Any] | None) -> int | None:
    """The tensor-parallel size of an engine run inside the rank's own process (external
    launcher: its TP group is ranks of the job), else None."""
    if not settings or settings.get("distributed_executor_backend") != "external_launcher":
        return None
    size = settings.get("tensor_parallel_size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def engine_collective_cause(stacks: Mapping[int, RankStacks], culprits: Iterable[int],
                            waiting: Iterable[int], tp_sizes: Mapping[int, int] | None = None
                            ) -> Cause | None:
    """``engine_collective`` (see above) for the first culprit whose main thread waits in its
    rollout engine's collective (its TP group's, or its data-parallel replicas' sync) while no
    waiting rank's does; None otherwise. ``tp_sizes``: a colocated engine's TP size by rank,
    where its agent recorded it; its TP group is the block of consecutive ranks vLLM's external
    launcher makes, its DP group the ranks at the same place of every block, and only waiting
    ranks of that group are named (unknown: every waiting rank, as the group may hold any)."""
    waiting = sorted(waiting)
    if any(_engine_wait(main_of(stacks, r)) for r in waiting):
        return None
    for culprit in sorted(culprits):
        main = main_of(stacks, culprit)
        found = _engine_wait(main)
        if found is None or main is None:
            continue
        group, engine, frame = found
        size = (tp_sizes or {}).get(culprit)
        peers = [r for r in waiting if size is None or _same_group(group, size, r, culprit)]
        if peers:
            mine = user_frame(main)
            return Cause("engine_collective", _engine_says(culprit, group, engine, frame, peers),
                         DP_ENGINE_FIX if group == DATA_PARALLEL else ENGINE_FIX, {
                "engine_rank": culprit, "engine_frame": str(frame),
                "user_frame": str(mine) if mine is not None else "", "outside_engine": peers,
                "tp_size": size, "engine_group": group, "engine": engine})
    return None


TENSOR_PARALLEL, DATA_PARALLEL = "tensor-parallel", "data-parallel"


def _engine_wait(thread: ThreadStack | None) -> tuple[str, str, Frame] | None:
    """(the group, the engine's name, the frame) of the engine collective the thread waits
    in: its data-parallel replicas' sync, else its TP group's collective."""
    synced = waits_in_engine_dp_sync(thread)
    if synced is not None:
        return DATA_PARALLEL, synced[0].name, synced[1]
    frame = waits_in_engine_collective(thread)
    if frame is None:
        return None
    engine = engines.by_wait(frame_wait(frame))
    return TENSOR_PARALLEL, engine.name if engine else "vLLM", frame


def _same_group(group: str, tp_size: int, rank: int, other: int) -> bool:
    """Whether two ranks are in one engine group: one TP block, or one place in every block
    (a DP group, pipeline parallelism left aside)."""
    if group == DATA_PARALLEL:
        return rank % tp_size == other % tp_size
    return rank // tp_size == other // tp_size


def _engine_says(culprit: int, group: str, engine: str, frame: Frame, peers: list[int]) -> str:
    others, one = ", ".join(f"rank {r}" for r in peers), len(peers) == 1
    outside = (f"while {others} {'waits' if one else 'wait'} outside "
               f"{'its' if one else 'their'} engine: each side waits for the other")
    if group == DATA_PARALLEL:
        return (f"rank {culprit} waits there in its colocated {engine} engine's data-parallel "
                f"sync ({frame.function}), which ends only when the engine of every rank of "
                f"its DP group joins it, {outside}; the data-parallel engines are out of step, "
                "their ranks did not run the same generate calls")
    return (f"rank {culprit} waits there in its colocated {engine} engine's {group} "
            f"{frame.name}, which ends only when every rank of its TP group joins it, "
            f"{outside}, the ranks of one engine did not run the same generate calls")


def main_of(stacks: Mapping[int, RankStacks], rank: int) -> ThreadStack | None:
    """The thread the rank's work runs on, from its stacks (None without them)."""
    found = stacks.get(rank)
    return found.main if found is not None else None


def difference_cause(flight: Mapping[int, FlightDump], stacks: Mapping[int, RankStacks],
                     culprits: Iterable[int], waiting: Iterable[int],
                     log: Sequence[str] = ()) -> Cause | None:
    """The cause of ``culprits`` missing from the collective ``waiting`` sit in, from their
    Flight Recorder dumps: a culprit pending in another collective at a sequence number a
    waiting rank is pending at (None when no dump shows one). A pending entry without frames
    (torch records them only in some set-ups) takes the rank's stack: a main thread waiting in
    a collective or in autograd's backward issued the pending one from there. ``log``: the
    job's latest output lines (redacted), read for a batch skipped after an error."""
    others = {other: _pending(flight.get(other), stacks.get(other)) for other in sorted(waiting)}
    for culprit in sorted(culprits):
        mine = _pending(flight.get(culprit), stacks.get(culprit))
        for other, pending in others.items():
            for key, theirs in pending.items():
                entry = mine.get(key)
                if entry is not None and _differ(entry, theirs):
                    return _cause((culprit, entry), (other, theirs), flight, log)
    return None


def _differ(entry: FlightEntry, theirs: FlightEntry) -> bool:
    """Whether two ranks' collectives at one sequence number are different calls."""
    return ((op_name(entry), entry.input_sizes, from_backward(entry))
            != (op_name(theirs), theirs.input_sizes, from_backward(theirs)))


def _pending(dump: FlightDump | None, stacks: RankStacks | None
             ) -> dict[tuple[str, int], FlightEntry]:
    """(group, seq) -> the pending collective there, of one rank's dump (frames from the
    rank's main thread where the dump has none and that thread waits in a collective or in a
    backward pass: where it issued the pending one)."""
    if dump is None:
        return {}
    main = stacks.main if stacks is not None else None
    waits = main.frames if main is not None and (
        in_collective(main) or _in_backward(main.frames)) else ()
    return {(e.group, e.seq): e if e.frames else replace(e, frames=waits)
            for e in dump.entries if e.pending and not e.p2p and e.seq > 0}


def _cause(mine: tuple[int, FlightEntry], theirs: tuple[int, FlightEntry],
           flight: Mapping[int, FlightDump], log: Sequence[str]) -> Cause:
    (culprit, entry), (other, their) = mine, theirs
    facts = {"source": "flight_recorder", "group": entry.group, "seq": entry.seq,
             "ops": {str(culprit): op_name(entry), str(other): op_name(their)},
             "frames": {str(culprit): issued_at(entry), str(other): issued_at(their)}}
    group = "world" if entry.group_desc == "default_pg" else entry.group_desc or entry.group
    where = f"#{entry.seq} of group {group} in the Flight Recorder"
    if from_backward(entry) and not from_backward(their) and stepped(flight[other], their):
        return _uneven(mine, theirs, _gradient(entry, where), facts, skip_line(log), flight)
    if _same_call(entry, their) and op_name(entry) == op_name(their) \
            and entry.input_sizes != their.input_sizes and not from_backward(entry) \
            and not sharded_gather(entry):
        return _size_mismatch(mine, theirs, where, facts)
    for forward, other_side in ((mine, theirs), (theirs, mine)):
        if sharded_gather(forward[1]) and not _same_call(forward[1], other_side[1]):
            sharded = _sharded_forward(forward, other_side, flight, where, facts, log)
            if sharded is not None:
                return sharded
    known = {culprit: call_sites(flight[culprit]), other: call_sites(flight[other])}
    for (alone, call), (never, common) in ((mine, theirs), (theirs, mine)):
        if _on_a_branch(call, known[never], common, known[alone]):
            return _some_ranks_only(alone, call, never, where, facts)
    both = f"rank {culprit} is in {op_name(entry)}{_at(entry)} and rank {other} in " \
           f"{op_name(their)}{_at(their)}, both {where}"
    if issued_at(entry) in known[other] and issued_at(their) in known[culprit]:
        return Cause("collective_order", f"{both}: the ranks call the same collectives in a "
                     "different order", COLLECTIVE_ORDER_FIX, facts)
    return Cause("different_collectives", f"{both}: the ranks wait in different collectives "
                 "(the dumps hold too few frames to tell whether one is called on some ranks "
                 "only or the order differs)", COLLECTIVE_ORDER_FIX, facts)


def _size_mismatch(mine: tuple[int, FlightEntry], theirs: tuple[int, FlightEntry],
                   where: str, facts: dict[str, Any]) -> Cause:
    """Both ranks in one collective from one line, with tensors of different sizes."""
    (culprit, entry), (other, their) = mine, theirs
    sizes = {str(culprit): [list(s) for s in entry.input_sizes],
             str(other): [list(s) for s in their.input_sizes]}
    says = (f"rank {culprit} and rank {other} are in the same {op_name(entry)} ({where}) at "
            f"{issued_at(entry)} with tensors of different sizes ({_shapes(entry)} against "
            f"{_shapes(their)})")
    objects = _object_collective(entry)
    if objects == "broadcast_object_list" and _one_dim(entry) and _one_dim(their):
        says += (f": broadcast_object_list with lists of {entry.input_sizes[0][0]} and "
                 f"{their.input_sizes[0][0]} objects")
    elif objects:
        says += f", inside {objects}"
    return Cause("size_mismatch", says, SIZE_MISMATCH_FIX,
                 {**facts, "input_sizes": sizes, "object_collective": objects})


def _shapes(entry: FlightEntry) -> str:
    return ", ".join("x".join(map(str, s)) or "scalar" for s in entry.input_sizes) or "none"


def _one_dim(entry: FlightEntry) -> bool:
    return len(entry.input_sizes) == 1 and len(entry.input_sizes[0]) == 1


def _object_collective(entry: FlightEntry) -> str:
    """The object collective (all_gather_object, broadcast_object_list, ...) that issued it."""
    names = {f.name for f in entry.frames}
    return next((n for n in _OBJECT_COLLECTIVES if n in names), "")


def _gradient(entry: FlightEntry, where: str) -> str:
    return (f"waits in DDP's gradient {op_name(entry)} ({where}), issued by backward() at "
            f"{issued_at(entry) or 'an unknown frame'}")


def _uneven(mine: tuple[int, FlightEntry], theirs: tuple[int, FlightEntry], doing: str,
            facts: dict[str, Any], skipped: str, flight: Mapping[int, FlightDump]) -> Cause:
    """Rank ``mine`` is in a training step (``doing`` says how) where rank ``theirs``, out of
    its training steps, waits in another collective; ``skipped``: a log line of a batch skipped
    after an error ('' when none). Where both dumps hold the group's whole history, the facts
    and the sentence say how many collectives each rank issued from backward()."""
    (culprit, entry), (other, their) = mine, theirs
    counts = {rank: backward_count(flight[rank], entry.group) for rank in (culprit, other)}
    waits = (f"rank {culprit} {doing}, where rank {other}, out of its training steps, is in "
             f"{op_name(their)}{_at(their)}")
    if None not in counts.values():
        facts = {**facts, "backward_collectives": {str(r): n for r, n in counts.items()}}
        waits += (f" (rank {culprit} issued {counts[culprit]} collectives from backward(), "
                  f"rank {other} {counts[other]})")
    if skipped:
        says = (f"{waits}: the ranks ran different numbers of steps, and the job's log shows a "
                f"batch skipped after an error ({skipped!r}): a rank that skips a step alone "
                "issues one gradient all-reduce fewer than the others")
        return Cause("skipped_step", says, SKIPPED_STEP_FIX, {**facts, "log_line": skipped})
    says = (f"{waits}: the ranks ran different numbers of steps (uneven inputs), some ranks "
            f"skipped a step, or rank {other} left the loop on a branch the others did not take")
    return Cause("uneven_steps", says, UNEVEN_STEPS_FIX, facts)


def backward_count(dump: FlightDump, group: str) -> int | None:
    """How many collectives of ``group`` the rank issued from backward(), counted once per
    sequence number; None when its Flight Recorder no longer holds the group's first one (the
    ring wrapped: the count would be short)."""
    entries = [e for e in dump.entries if e.group == group and not e.p2p and e.seq > 0]
    if not entries or min(e.seq for e in entries) != 1:
        return None
    return len({e.seq for e in entries if from_backward(e)})


def _sharded_forward(forward: tuple[int, FlightEntry], other_side: tuple[int, FlightEntry],
                     flight: Mapping[int, FlightDump], where: str, facts: dict[str, Any],
                     log: Sequence[str]) -> Cause | None:
    """Rank ``forward`` gathers sharded parameters for a forward where the other rank is in
    another collective: a forward the other never ran (a frame of its path is nowhere in the
    other's history), or one it ran fewer times. None when the other's history holds no
    frames to compare with."""
    (rank, entry), (other, their) = forward, other_side
    ran = frames_run(flight[other])
    if not ran:
        return None
    lib, path = sharded_gather(entry), " called from ".join(user_frames(entry))
    gathers = (f"rank {rank} gathers its layers' sharded parameters ({lib}: {op_name(entry)}, "
               f"{where}) for a forward at {path or 'an unknown frame'}")
    facts = {**facts, "sharding": lib, "forward_rank": rank, "forward_frames": user_frames(entry)}
    if not set(user_frames(entry)) <= ran:
        return _forward_alone(forward, other_side, gathers, path, facts)
    if not _generating(entry) and stepped(flight[other], their):
        return _uneven(forward, other_side, f"{gathers} in a training step", facts,
                       skip_line(log), flight)
    says = (f"{gathers}, a forward rank {other} ran too and has left: it is in "
            f"{op_name(their)}{_at(their)}. Under {lib} every forward gathers each layer's "
            "parameters from all ranks, so ranks that run different numbers of forward passes "
            "(generate() stopping at different lengths without synced_gpus) wait for each other")
    return Cause("forward_count_differs", says, FORWARD_COUNT_FIX, facts)


def _forward_alone(forward: tuple[int, FlightEntry], other_side: tuple[int, FlightEntry],
                   gathers: str, path: str, facts: dict[str, Any]) -> Cause:
    """Rank ``forward``'s forward runs on a path the other rank never took."""
    (rank, _), (other, their) = forward, other_side
    says = (f"{gathers}, which rank {other} never ran (not in its Flight Recorder): it is in "
            f"{op_name(their)}{_at(their)}. Under {facts['sharding']} every forward gathers "
            "each layer's parameters from all ranks: a forward, generate() or "
            "summon_full_params() on some ranks only waits for ranks that never join")
    fix = (f"Run the forward on every rank: {path or 'the forward'} runs on rank {rank} and not "
           f"on rank {other}. Generate or evaluate on all ranks (each on its own share of the "
           "prompts) and gather the results; for a sample on rank 0 only, gather a full copy "
           "of the parameters first on every rank (FSDP's summon_full_params, rank0_only "
           "included, and deepspeed.zero.GatheredParameters must be entered by every rank), or "
           "keep an unsharded copy of the model for sampling.")
    return Cause("forward_on_some_ranks", says, fix, facts)


def frames_run(dump: FlightDump) -> set[str]:
    """Every frame outside libraries on the path of a collective the rank's Flight Recorder
    still holds."""
    return {frame for e in dump.entries if not e.p2p for frame in user_frames(e)}


def sharded_gather(entry: FlightEntry) -> str:
    """'FSDP' or 'ZeRO-3' where the collective gathers sharded parameters outside backward()
    (for a forward, or summon_full_params / GatheredParameters); '' otherwise."""
    if from_backward(entry):
        return ""
    for frame in entry.frames:
        name, path = frame.name, frame.filename.replace("\\", "/")
        for lib, part, names in _SHARDED:
            if part in path and any(n in name for n in names):
                return lib
    return ""


def _generating(entry: FlightEntry) -> bool:
    """Whether the forward runs inside a generate() (Hugging Face's or the job's own)."""
    return any(f.name in ("generate", "_sample", "_greedy_search", "_beam_search")
               for f in entry.frames)


def _same_call(entry: FlightEntry, their: FlightEntry) -> bool:
    """Both ranks' collectives were issued from one line (the same gather out of step)."""
    return bool(issued_at(entry)) and issued_at(entry) == issued_at(their)


def skip_line(log: Sequence[str]) -> str:
    """The job's latest line that says a batch or step was skipped after an error ('' when
    none); skips every rank makes together (the fp16 loss scaler's overflow) are not read."""
    for line in reversed(log):
        if _SKIP.search(line) and _ERROR.search(line) and not _ALL_RANKS.search(line):
            return line.strip()[:LOG_LINE_CHARS]
    return ""


def _some_ranks_only(alone: int, call: FlightEntry, never: int, where: str,
                     facts: dict[str, Any]) -> Cause:
    """Rank ``alone`` waits in a collective issued where rank ``never`` never issued one."""
    path = " called from ".join(user_frames(call))
    says = (f"rank {alone} is in {op_name(call)} ({where}) at {path}, a call that rank {never} "
            "never made (not in its Flight Recorder): a collective under a branch that only "
            "some ranks take")
    fix = (f"Call the collective on every rank, or move it out of the branch: {path} runs on "
           f"rank {alone} and not on rank {never} (e.g. `if rank == 0: save(...)` followed by "
           "`dist.barrier()` on every rank, not inside the branch).")
    return Cause("some_ranks_only", says, fix,
                 {**facts, "branch_rank": alone, "branch_frames": user_frames(call)})


def _on_a_branch(call: FlightEntry, others_sites: set[str], common: FlightEntry,
                 own_sites: set[str]) -> bool:
    """Whether ``call`` was made on a path the other rank never took, where the other rank's
    ``common`` is on the path every rank takes: ``call``'s line is nowhere in the other rank's
    history (which has frames), and ``common``'s line is in the calling rank's history too, or
    ``common`` is DDP's gradient all-reduce (every training step makes it)."""
    site = issued_at(call)
    return bool(site and others_sites and site not in others_sites
                and (issued_at(common) in own_sites
                     or (from_backward(common) and not from_backward(call))))


def stepped(dump: FlightDump, pending: FlightEntry) -> bool:
    """Whether the rank ran training steps before its pending collective: its Flight Recorder
    holds a gradient all-reduce from backward() of the same group before it (a rank that waits
    in a collective before its first step, in loading or set-up code, ran none)."""
    return any(from_backward(e) for e in dump.entries
               if e.group == pending.group and not e.p2p and 0 < e.seq < pending.seq)


def call_sites(dump: FlightDump) -> set[str]:
    """Where the rank issued the collectives its Flight Recorder still holds."""
    return {issued_at(e) for e in dump.entries if not e.p2p} - {""}


def user_frames(entry: FlightEntry) -> list[str]:
    """The frames outside libraries where the collective was issued, innermost first."""
    return [str(f) for f in entry.frames if not is_library(f.filename)]


def from_backward(entry: FlightEntry) -> bool:
    """Whether the collective was issued inside autograd's backward pass (DDP's reducer)."""
    return _in_backward(entry.frames)


def _in_backward(frames: tuple[Frame, ...]) -> bool:
    return any(f.function in _BACKWARD_FUNCTIONS for f in frames)


def issued_at(entry: FlightEntry) -> str:
    """The innermost frame outside libraries where the collective was issued ('' if none)."""
    return next(iter(user_frames(entry)), "")


def _at(entry: FlightEntry) -> str:
    where = issued_at(entry)
    return f" at {where}" if where else ""


def crossed_cause(groups: Sequence[tuple[str, str, int]]) -> Cause:
    """The cause of ranks that wait for each other in two groups' collectives (``groups``:
    each side's group, op and sequence number)."""
    names = " and ".join(f"{g}" for g, _, _ in groups)
    return Cause("crossed_groups", f"the ranks issue the collectives of groups {names} in "
                 "different orders: each side waits for the other", CROSSED_FIX,
                 {"source": "agent", "groups": [{"group": g, "op": op, "seq": seq}
                                                for g, op, seq in groups]})
