"""What redacting the job's output costs the sidecar, which runs ``redact_text`` on every line the
job prints (``LogFeed.drain``).

    python benchmarks/redact_cost.py [--lines 200000] [--repeats 5] [--before REV]

The lines are realistic: tqdm bars, swift's metric dicts and args dump, vLLM's throughput lines,
torch / NCCL / DeepSpeed log lines and warnings (many hold ``tokens`` or ``key``, so they get past
the cheap first search), and about 1 % with a secret (a credentialed URL, a token, ``api_key=``).

Printed, from the same run (medians of interleaved repeats, in CPU time):
- ``redact_text`` alone, per line, on ordinary training output and on lines that each hold a
  secret (every kind the redactor knows), against a baseline loop that only reads each line
  (``len``), the floor of any per-line work in Python, and against the redactor of git revision
  ``--before`` (default: the one before the detect-secrets catalogue, issue 31), loaded from git
  into this process;
- what the sidecar does per line: ``LogFeed.put`` then ``drain`` (the queue, the tail, the progress
  and launcher-line parsers) with redaction, against the same with redaction switched off.
"""
from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stalldoc import redact  # noqa: E402
from stalldoc.model.samples import LogLine  # noqa: E402
from stalldoc.redact import redact_text  # noqa: E402
from stalldoc.sidecar.log_feed import LogFeed  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "437e0c6"   # the last revision with the hand-written list alone

# (weight, line): a GRPO run's output, by how often each kind of line comes
ORDINARY = [
    (40, "Train:  {pct}%|████▌     | {step}/1000 [01:23<01:42,  5.37it/s]"),
    (10, "{{'loss': 0.{n}, 'grad_norm': 1.23, 'learning_rate': 9.8e-06, 'memory(GiB)': 23.4, "
         "'train_speed(iter/s)': 0.052, 'completions/mean_length': 211.3, "
         "'completions/max_length': 512.0, 'rewards/accuracy/mean': 0.31, 'reward': 0.31, "
         "'reward_std': 0.2, 'kl': 0.0012, "
         "'clip_ratio/region_mean': 0.0, 'num_tokens': {n}567.0, 'epoch': 0.12, "
         "'global_step/max_steps': '{step}/1000', 'percentage': '{pct}.00%', 'elapsed_time': "
         "'14m 3s', 'remaining_time': '5h 1m'}}"),
    (15, "[2025-01-01 12:00:00,123] [INFO] [logging.py:128:log_dist] [Rank 0] step={step}, "
         "skipped=0, lr=[9.8e-06], mom=[(0.9, 0.95)]"),
    (8, "INFO 11-21 14:03:12 [metrics.py:351] Avg prompt throughput: {n}.5 tokens/s, Avg "
        "generation throughput: 5432.1 tokens/s, Running: 64 reqs, Swapped: 0 reqs, Pending: 0 "
        "reqs, GPU KV cache usage: {pct}.3%, CPU KV cache usage: 0.0%."),
    (5, "Loading checkpoint shards: {pct}%|██████████| 4/4 [00:05<00:00,  1.25s/it]"),
    (5, ""),
    (3, "[rank{r}]:[W1121 14:03:12.123456 ProcessGroupNCCL.cpp:4561] [PG ID 0 PG GUID 0 Rank {r}]  "
        "using GPU {r} to perform barrier as devices used by this process are currently unknown."),
    (3, "/usr/lib/python3.11/site-packages/transformers/generation/utils.py:1234: UserWarning: "
        "`max_new_tokens` (=512) and `max_length`(=4096) seem to have been set. `max_new_tokens` "
        "will take precedence."),
    (2, "[INFO:swift] Setting pad_token_id to eos_token_id:151643 for open-end generation."),
    (2, "[INFO:swift] Saving model checkpoint to /output/v0-20250101-120000/checkpoint-{step}"),
    (1, "INFO 11-21 14:03:12 [block_manager.py:88] # GPU blocks: {n}, # CPU blocks: 512; "
        "num_key_value_heads=8 key_value_dim=128"),
    (1, "[INFO:swift] args: RLHFArguments(model='Qwen/Qwen2.5-7B-Instruct', tokenizer=None, "
        "max_new_tokens=512, max_length=4096, lazy_tokenize=False, hub_token=None, use_vllm=True, "
        "vllm_server_host=['10.0.0.5'], vllm_server_port=[8000], num_generations=8)"),
]
SECRET = [
    "[INFO:swift] connecting to http://admin:s3cr3t-{n}@10.0.0.5:8000/v1",
    "wandb: login with api_key=0123456789abcdef{n}",
    "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ{n}In0.c2lnbmF0dXJl",
    "[INFO:swift] args: RLHFArguments(hub_token='hf_AbCdEfGhIjKlMnOpQrStUv{n}', "
    "max_new_tokens=512)",
    "key = '-----BEGIN RSA PRIVATE KEY-----\\nMIIEowIBAAKCAQEA{n}xVb5NAZ1y\\n-----END RSA PRIVATE KEY-----'",
    "posting to https://hooks.slack.com/services/T0{n}ABCD/B0456EFGH/abcdefghijABCDEFGHIJ1234",
    "stripe: sk_live_4eC39HqLyjWDarjtT1zdp7dc{n}",
    "twilio sid AC0123456789abcdef0123456789ab{n:04d}",
    "sendgrid SG.ngeVfQFYQlKU0ufo8x5d1A.TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s{n:04d}",
    "AZURE_STORAGE=DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={n:04d}"
    "aGVsbG8gd29ybGQgaGVsbG8gd29ybGQgaGVsbG8gd29ybGQgaGVsbG8gd29ybGQgaGVsbG8gd29ybGQgaGVsbG8=;",
]


def corpus(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    weights, templates = zip(*ORDINARY)
    lines = []
    for i in range(count):
        template = rng.choice(SECRET) if rng.random() < 0.01 else \
            rng.choices(templates, weights)[0]
        lines.append(template.format(pct=i % 100, step=i % 1000, n=rng.randrange(10_000), r=i % 8))
    return lines


def _time(fn: Callable[[], object]) -> float:
    """CPU seconds: on a shared machine wall time counts the other processes' turns too."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def _baseline(lines: list[str]) -> None:
    for line in lines:
        len(line)


def _redact_all(lines: list[str], fn: Callable[[str], str] = redact_text) -> None:
    for line in lines:
        fn(line)


def redactor_at(rev: str) -> Callable[[str], str]:
    """``redact_text`` as git revision ``rev`` had it (a module of its own in this process)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:stalldoc/redact.py"],
                            capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "redact_before.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("redact_before", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module.redact_text


def secret_lines(count: int) -> list[str]:
    return [SECRET[i % len(SECRET)].format(n=1000 + i % 9000) for i in range(count)]


def _feed(lines: list[LogLine]) -> None:
    feed = LogFeed()
    for start in range(0, len(lines), 10_000):   # a tick's worth at a time, as the watcher does
        for line in lines[start:start + 10_000]:
            feed.put(line)
        feed.drain()
        feed.take_unread()


def _feed_unredacted(lines: list[LogLine]) -> None:
    original = redact.LineRedactor.line
    redact.LineRedactor.line = lambda self, text: text   # type: ignore[method-assign]
    try:
        _feed(lines)
    finally:
        redact.LineRedactor.line = original   # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", default=BEFORE, help="git revision of the baseline redactor")
    args = parser.parse_args()
    before = redactor_at(args.before)
    weights, templates = zip(*ORDINARY)
    rng = random.Random(0)
    ordinary = [rng.choices(templates, weights)[0].format(pct=i % 100, step=i % 1000,
                                                          n=rng.randrange(10_000), r=i % 8)
                for i in range(args.lines)]
    secrets = secret_lines(args.lines // 10)
    lines = corpus(args.lines)
    logged = [LogLine(float(i), "stdout", text) for i, text in enumerate(lines)]
    cases: dict[str, tuple[int, Callable[[], object]]] = {
        "baseline loop, ordinary": (len(ordinary), lambda: _baseline(ordinary)),
        f"before ({args.before}), ordinary": (len(ordinary), lambda: _redact_all(ordinary, before)),
        "redact_text, ordinary": (len(ordinary), lambda: _redact_all(ordinary)),
        f"before ({args.before}), secrets": (len(secrets), lambda: _redact_all(secrets, before)),
        "redact_text, secrets": (len(secrets), lambda: _redact_all(secrets)),
        "feed, no redaction": (len(logged), lambda: _feed_unredacted(logged)),
        "feed, redacted": (len(logged), lambda: _feed(logged))}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, (_, fn) in cases.items():
            times[name].append(_time(fn))
    per_line = {name: statistics.median(times[name]) * 1e6 / count
                for name, (count, _) in cases.items()}
    missed = sum(before(line) == line for line in secrets)
    print(f"{len(ordinary)} ordinary lines, {len(secrets)} lines with a secret "
          f"({missed} of them left whole by {args.before}, "
          f"{sum(redact_text(line) == line for line in secrets)} by this one), "
          f"{args.repeats} repeats (median CPU time)")
    for name, micros in per_line.items():
        print(f"  {name:32s} {micros:6.2f} us/line")
    for kind in ("ordinary", "secrets"):
        now, then = per_line[f"redact_text, {kind}"], per_line[f"before ({args.before}), {kind}"]
        print(f"{kind}: this redactor / {args.before}: {now / then:.2f}x")
    print(f"feed redacted / feed without: "
          f"{per_line['feed, redacted'] / per_line['feed, no redaction']:.2f}x")


if __name__ == "__main__":
    main()
