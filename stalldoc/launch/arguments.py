"""The numbers of a command line, checked in one place: every numeric swift argument the GRPO plan
and the launch rules use, and the processes per node / nodes, with the range swift accepts and a
sane upper bound.

Whole numbers are read as swift reads them (Python ``int``: ``8.0`` and ``1e3`` are refused);
other numbers must be finite. A value outside its range is a BadArgument with one line saying
which argument, the value and what it must be; nothing downstream ever divides by zero, converts
infinity or lists the divisors of 10**30.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

COUNT_MAX = 10**6              # batch sizes, generations, iterations, accumulation steps
TOKENS_MAX = 10**8             # sequence lengths
STEPS_MAX = 10**9              # steps, generation batch
_SHOWN = 40                    # characters of a bad value repeated in the message


class BadArgument(ValueError):
    """A numeric argument swift would refuse or that cannot be planned with; one line."""


@dataclass(frozen=True)
class NumberSpec:
    """What a numeric argument may be: a whole number or a finite real in [low, high] (low
    excluded when ``low_open``)."""

    whole: bool
    low: float
    high: float
    low_open: bool = False

    def describe(self) -> str:
        low, high = f"{self.low:.10g}", f"{self.high:.10g}"
        if self.whole:
            return f"a whole number from {low} to {high}"
        if (self.low, self.high) == (0, 1):
            return f"a fraction in {'(' if self.low_open else '['}0, 1]"
        return f"a finite number {'>' if self.low_open else '>='} {low}, at most {high}"

    def parse(self, text: str) -> int | float:
        """The value, or ValueError when it is not in range."""
        value: int | float = int(text) if self.whole else float(text)
        if not math.isfinite(value) or value > self.high or value < self.low \
                or (self.low_open and value == self.low):
            raise ValueError(text)
        return value


def _whole(low: int, high: int) -> NumberSpec:
    return NumberSpec(True, low, high)


# swift 4.x names (3.x names are mapped before they get here); ../shared/notes/swift.md
SWIFT_NUMBERS: Mapping[str, NumberSpec] = {
    "per_device_train_batch_size": _whole(1, COUNT_MAX),
    "per_device_eval_batch_size": _whole(1, COUNT_MAX),
    "gradient_accumulation_steps": _whole(1, COUNT_MAX),
    "steps_per_generation": _whole(1, COUNT_MAX),
    "generation_batch_size": _whole(1, STEPS_MAX),
    "num_generations": _whole(1, COUNT_MAX),        # 1 is SD407's finding, in swift's words
    "num_generations_eval": _whole(1, COUNT_MAX),
    "num_iterations": _whole(1, COUNT_MAX),
    "num_train_epochs": NumberSpec(False, 0, COUNT_MAX, low_open=True),
    "max_steps": _whole(-1, STEPS_MAX),             # -1 (swift's default) or 0: by epochs
    "max_length": _whole(1, TOKENS_MAX),
    "max_completion_length": _whole(1, TOKENS_MAX),
    "vllm_max_model_len": _whole(1, TOKENS_MAX),
    "vllm_max_num_seqs": _whole(1, COUNT_MAX),
    "vllm_gpu_memory_utilization": NumberSpec(False, 0, 1, low_open=True),
    "vllm_tensor_parallel_size": _whole(1, 1024),
    "num_infer_workers": _whole(1, 1024),
    "split_dataset_ratio": NumberSpec(False, 0, 1),   # swift asserts 0 <= ratio <= 1
    "save_total_limit": _whole(-1, COUNT_MAX),        # <= 0: no limit (transformers)
    "save_steps": NumberSpec(False, 0, STEPS_MAX, low_open=True),  # < 1: share of max_steps
    "sleep_level": _whole(0, 2),
}
NPROC_PER_NODE = _whole(1, 1024)
NNODES = _whole(1, 100_000)
TORCHRUN_NPROC_WORDS = frozenset({"auto", "cpu", "gpu", "xpu"})   # torchrun --nproc_per_node


def shown(text: str) -> str:
    """A value as the message repeats it: plain when short and plain, else quoted and cut."""
    if text and len(text) <= _SHOWN and text.isascii() and text.isprintable() and " " not in text:
        return text
    cut = text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
    return ascii(cut)


def checked(label: str, text: str | None, spec: NumberSpec) -> int | float:
    """``text`` read by ``spec``, else BadArgument("``label`` ``text``: must be ...")."""
    if text is None:
        raise BadArgument(f"{label}: needs a value, {spec.describe()}")
    try:
        return spec.parse(text)
    except (ValueError, OverflowError):
        raise BadArgument(f"{label} {shown(text)}: must be {spec.describe()}") from None


def swift_number(name: str, values: tuple[str, ...]) -> int | float:
    """The last value given for swift argument ``name`` (one of SWIFT_NUMBERS), checked."""
    return checked(f"--{name}", values[-1] if values else None, SWIFT_NUMBERS[name])


def swift_problems(args: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """One line per numeric swift argument given with a value swift or the plan cannot use."""
    problems = []
    for name, values in args.items():
        if name in SWIFT_NUMBERS:
            try:
                swift_number(name, values)
            except BadArgument as exc:
                problems.append(str(exc))
    return tuple(problems)
