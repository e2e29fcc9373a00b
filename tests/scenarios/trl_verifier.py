"""A GRPO reward function for TRL's CLI, as its docs say to pass one: ``trl grpo --reward_funcs
trl_verifier.verified_reward`` (a dotted path TRL imports from the working directory or
PYTHONPATH).

Each call scores the batch's completions. With VERIFIER_URL set, call number STUCK_CALL (default
2) and later ones POST the completions to that verifier and wait for its verdict the way reward
code usually does, with ``urllib.request.urlopen`` and no timeout; a verifier that accepted the
connection and never answers holds the training process there for good (ms-swift #6962, a job
stuck five hours on an external reward server). Without VERIFIER_URL, or before STUCK_CALL, the
score is computed here: shorter completions score higher. Each call prints ``reward call N``."""
import json
import os
import urllib.request

VERIFIER_URL = os.environ.get("VERIFIER_URL", "")
STUCK_CALL = int(os.environ.get("STUCK_CALL", "2"))
_calls = 0


def _text(completion) -> str:
    """A completion as text: a string, or a conversation's messages."""
    if isinstance(completion, str):
        return completion
    return "".join(message.get("content", "") for message in completion)


def ask_verifier(texts: list[str]) -> list[float]:
    """The verifier's scores for ``texts``: blocks until it answers."""
    request = urllib.request.Request(VERIFIER_URL, data=json.dumps({"texts": texts}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())["scores"]


def verified_reward(completions, **kwargs) -> list[float]:
    global _calls
    _calls += 1
    print(f"reward call {_calls}", flush=True)
    texts = [_text(c) for c in completions]
    if VERIFIER_URL and _calls >= STUCK_CALL:
        return ask_verifier(texts)
    return [1.0 / (1 + len(t)) for t in texts]
