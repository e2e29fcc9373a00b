"""A reward model's HTTP server, as RL jobs run one beside their trainer (a verifier or a
reward model scoring rollouts over HTTP: verl's and OpenRLHF's remote reward, swift's
--reward_model_plugin servers): uvicorn on its main thread, an ASGI app that scores the texts it
is sent. Like many such servers it batches requests for its model: it scores once BATCH
requests are in (a batcher with no timeout), 1 by default.

POST /score {"texts": [...]} -> {"scores": [...]}; GET /health -> ok.

argv: [BATCH]"""
import asyncio
import json
import sys

import uvicorn

BATCH = int(sys.argv[1]) if len(sys.argv) > 1 else 1
_pending: list[tuple[list[str], asyncio.Future]] = []


def score(text: str) -> float:
    """A stand-in reward model's forward pass: some CPU per text."""
    total = 0
    for i in range(200_000):
        total = (total * 31 + ord(text[i % len(text)] if text else "x")) % 1_000_003
    return round(sum(ch.isdigit() for ch in text) / max(1, len(text)) + total * 1e-9, 6)


async def scored(texts: list[str]) -> list[float]:
    """The texts' scores, once the batch is full."""
    future = asyncio.get_running_loop().create_future()
    _pending.append((texts, future))
    if len(_pending) >= BATCH:
        batch = _pending[:]
        _pending.clear()
        for their_texts, their_future in batch:
            their_future.set_result([score(t) for t in their_texts])
    return await future


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/score":
        reply = {"scores": await scored(json.loads(body)["texts"])}
    else:
        reply = {"ok": True}
    data = json.dumps(reply).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
