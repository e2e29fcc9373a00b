"""Short-lived children of the job's interpreter: the doctor's only way to learn what that
interpreter has (never imported here). Each prints one marked JSON line, read back here; the
user's own sitecustomize may print around it."""
from __future__ import annotations

import json
import subprocess
from typing import Any, Mapping, Sequence

MARK = "STALLDOC-DOCTOR "


def run_child(python: Sequence[str], code: str, env: Mapping[str, str], timeout: float
              ) -> tuple[dict[str, Any] | None, str]:
    """(what the child printed after MARK, '' ) or (None, why it said nothing)."""
    try:
        proc = subprocess.run([*python, "-c", code], env=dict(env), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"it did not answer within {timeout:.0f} s"
    except OSError as exc:
        return None, f"it could not start: {exc.strerror or exc}"
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            try:
                return json.loads(line[len(MARK):]), ""
            except ValueError:
                break
    tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return None, f"it failed: {tail[:300]}"
