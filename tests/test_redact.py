"""Redaction: every secret goes, every neighbour stays (command lines, log lines, evidence)."""
from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from stalldoc.redact import is_secret_name, redact_argv, redact_json, redact_text

HF = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dBjftJeZ4CVPmB92K27uhbUJU1p1rwW1gFWFOEjXk"
SK = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"
GHP = "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
AWS = "AKIAIOSFODNN7EXAMPLE"
SLACK = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"

# (command line, secrets that must go, words that must stay)
ARGV_CASES = [
    (["swift", "rlhf", "--rlhf_type", "grpo", "--model", "Qwen/Qwen2.5-7B-Instruct", "--hub_token",
      HF, "--max_new_tokens", "512", "--num_key_value_heads", "8", "--use_cache", "true"],
     [HF], ["--hub_token", "--max_new_tokens", "512", "--num_key_value_heads", "8", "--use_cache",
            "Qwen/Qwen2.5-7B-Instruct"]),
    (["env", "WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567", "HF_TOKEN=plainvalue42",
      "CUDA_VISIBLE_DEVICES=0,1", "NPROC_PER_NODE=2", "swift", "rlhf"],
     ["0123456789abcdef0123456789abcdef01234567", "plainvalue42"],
     ["WANDB_API_KEY=***", "HF_TOKEN=***", "CUDA_VISIBLE_DEVICES=0,1", "NPROC_PER_NODE=2"]),
    (["bash", "-c", f"cd /work && swift rlhf --model Qwen/Qwen2.5-0.5B --hf_token {HF} "
                    "--max_new_tokens 512 --tokenizer /models/tok"],
     [HF], ["cd /work && swift rlhf --model Qwen/Qwen2.5-0.5B --hf_token *** --max_new_tokens 512 "
            "--tokenizer /models/tok"]),
    (["bash", "-c", "HF_TOKEN=notashape123 python train.py --max_new_tokens 512"],
     ["notashape123"], ["HF_TOKEN=*** python train.py --max_new_tokens 512"]),
    (["swift", "rlhf", "--vllm_server_host", "http://trainer:Pa55w0rd@10.0.0.5:8000",
      "--vllm_server_port", "8000"],
     ["Pa55w0rd", "trainer:"], ["http://***@10.0.0.5:8000", "--vllm_server_port", "8000"]),
    (["mysql", "-u", "root", "-p", "hunter2", "-h", "db.internal"],
     ["hunter2"], ["-u", "root", "-p", "-h", "db.internal"]),
    (["bash", "-c", "mysql -u root -p hunter2 -h db.internal"],
     ["hunter2"], ["mysql -u root -p *** -h db.internal"]),
    (["python", "serve.py", "--config", '{"api_key": "abc123def456", "model": "gpt-4o", '
                                       '"max_tokens": 100}'],
     ["abc123def456"], ['{"api_key": "***", "model": "gpt-4o", "max_tokens": 100}']),
    (["python", "serve.py", "--config", '{"openai": {"apiKey": "' + SK + '"}}'],
     [SK], ['{"openai": {"apiKey": "***"}}']),
    (["curl", "-H", f"Authorization: Bearer {JWT}", "https://api.example.com/v1/models"],
     [JWT], ["Authorization: Bearer ***", "https://api.example.com/v1/models"]),
    (["tool", "--pass", "s3cr3t!", "--pwd", "hunter2", "--api-key=xyz123", "--password=", "-v"],
     ["s3cr3t!", "hunter2", "xyz123"], ["--pass", "--pwd", "--api-key=***", "--password=", "-v"]),
    (["deploy", "--auth-token", "--dry-run"], [], ["--auth-token", "--dry-run"]),
    (["git", "clone", f"https://{GHP}@github.com/org/repo.git"],
     [GHP], ["https://***@github.com/org/repo.git"]),
]

# command lines nothing may change
PLAIN_ARGV = [
    ["python", "-m", "http.server", "-p", "8080"],
    ["docker", "run", "-p", "8080:80", "-p", "127.0.0.1:9000:9000/tcp", "image"],
    ["bash", "-c", "mkdir -p /tmp/out && ssh -p 22 host true"],
    ["swift", "rlhf", "--tokenizer", "/models/tok", "--max_new_tokens", "512", "--max_tokens=100",
     "--num_key_value_heads", "8", "--use_cache", "--key_value_dim", "128", "--lazy_tokenize",
     "true", "--model_author", "swift", "--teacher_tag_key", "teacher", "--reft_layer_key",
     "layer", "--vera_projection_prng_key", "0", "--vllm_server_pass_dataset", "true",
     "--new_special_tokens", "/data/tokens.txt", "--pad_token", "<|endoftext|>"],
    ["torchrun", "--nproc_per_node", "2", "train.py", "--data", "/data/x.jsonl",
     "--vllm_server_host", "http://10.0.0.5:8000/v1"],
]

# (log line, secrets that must go, text that must stay)
TEXT_CASES = [
    (f"[INFO:swift] args: RLHFArguments(model='Qwen/Qwen2.5-7B', hub_token='{HF}', "
     "max_new_tokens=512, tokenizer=None)",
     [HF], ["hub_token='***'", "max_new_tokens=512", "tokenizer=None", "model='Qwen/Qwen2.5-7B'"]),
    ("Connecting to http://admin:s3cr3t@10.0.0.5:8000/v1/models", ["s3cr3t", "admin:"],
     ["Connecting to http://***@10.0.0.5:8000/v1/models"]),
    ("wandb: api_key=0123456789abcdef0123456789abcdef01234567 logged in",
     ["0123456789abcdef0123456789abcdef01234567"], ["wandb: api_key=*** logged in"]),
    (f"    'Authorization': 'Bearer {JWT}',", [JWT], ["'Authorization': 'Bearer ***'"]),
    (f"token refresh gave {JWT} at step 3", [JWT], ["token refresh gave *** at step 3"]),
    ("curl -H 'Authorization: Basic dXNlcjpwYXNzd29yZA==' http://host/x",
     ["dXNlcjpwYXNzd29yZA=="], ["Authorization: Basic ***", "http://host/x"]),
    ("requests: Bearer abc.def-123_456 rejected", ["abc.def-123_456"], ["Bearer *** rejected"]),
    (f"export OPENAI_API_KEY={SK}; python eval.py --max_tokens 100",
     [SK], ["export OPENAI_API_KEY=***; python eval.py --max_tokens 100"]),
    (f"aws_access_key_id = {AWS} region=us-east-1", [AWS], ["region=us-east-1"]),
    (f"slack webhook token {SLACK} posted", [SLACK], ["slack webhook token *** posted"]),
    ("db:\n  password: hunter2\n  user: trainer", ["hunter2"], ["password: ***", "user: trainer"]),
    ('{"client_secret": "cs-998877", "grant": "x"}', ["cs-998877"], ['"grant": "x"']),
    ('payload={\\"api_key\\": \\"esc4ped9\\", \\"n\\": 1}', ["esc4ped9"], ['\\"n\\": 1']),
    ("GET /v1/items?token=qwerty123&page=2", ["qwerty123"], ["token=***&page=2"]),
    ("apiKey=abc123 accessToken: 'xyz789' db.password = \"p w\"",
     ["abc123", "xyz789", "p w"], ["apiKey=***", "accessToken: '***'", 'db.password = "***"']),
]

# log lines nothing may change
PLAIN_TEXT = [
    "Train:  45%|████▌     | 450/1000 [01:23<01:42,  5.37it/s]",
    "{'loss': 0.2314, 'grad_norm': 1.2, 'num_tokens': 1234567.0, 'max_tokens': 100, "
    "'global_step/max_steps': '45/1000'}",
    "INFO 11-21 14:03:12 [metrics.py:351] Avg prompt throughput: 1234.5 tokens/s, Avg generation "
    "throughput: 5432.1 tokens/s, GPU KV cache usage: 45.3%",
    "[INFO:swift] Setting pad_token_id to eos_token_id:151643 for open-end generation.",
    "tokenizer_config.json: pad_token='<|endoftext|>', eos_token: <|im_end|>, token_type_ids: []",
    "RuntimeError: Error(s) in loading state_dict: Missing key: model.layers.0.weight",
    "All 12 checks pass: ok; auth: none; key: value",
    "my token is here; --tokenizer /models/tok --num_key_value_heads 8 --use_cache",
    "Start connecting to vLLM server http://127.0.0.1:8000/v1 (user@host shells are fine)",
    "/usr/lib/python3.11/site-packages/torch/distributed/run.py:792: FutureWarning: pre-p 2 layout",
    "hub_token=None hf_token: null",
    "",
]


@pytest.mark.parametrize("argv,secrets,kept", ARGV_CASES)
def test_command_line_secrets_go_and_neighbours_stay(argv, secrets, kept):
    out = redact_argv(argv)
    assert len(out) == len(argv)
    joined = "\n".join(out)
    assert [s for s in secrets if s in joined] == []
    assert [k for k in kept if k not in out and k not in joined] == []


@pytest.mark.parametrize("argv", PLAIN_ARGV)
def test_command_lines_without_secrets_are_unchanged(argv):
    assert redact_argv(argv) == argv


@pytest.mark.parametrize("line,secrets,kept", TEXT_CASES)
def test_log_line_secrets_go_and_neighbours_stay(line, secrets, kept):
    out = redact_text(line)
    assert [s for s in secrets if s in out] == []
    assert [k for k in kept if k not in out] == []


@pytest.mark.parametrize("line", PLAIN_TEXT)
def test_log_lines_without_secrets_are_unchanged(line):
    assert redact_text(line) == line


@pytest.mark.parametrize("name", ["hf_token", "HF_TOKEN", "OPENAI_API_KEY", "--pass", "--pwd",
                                  "api-key", "apiKey", "db.password", "password_file",
                                  "AWS_SECRET_ACCESS_KEY", "swanlab_secret", "--auth",
                                  "credentials", "HFToken", "api_key_2"])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["--tokenizer", "--max_new_tokens", "max_tokens",
                                  "--num_key_value_heads", "--use_cache", "--key_value_dim",
                                  "token_type_ids", "pad_token", "eos_token", "--model_author",
                                  "vera_projection_prng_key", "lazy_tokenize", "passes",
                                  "keyboard", "aws_access_key_id", ""])
def test_names_that_are_not_secret(name):
    assert not is_secret_name(name)


def test_evidence_strings_are_redacted_at_any_depth():
    evidence = {"lines": [f"hub_token='{HF}' step 3", "fine"], "count": 2,
                "nested": {"api_key": "plain-value-1", "max_tokens": "100", "urls": (
                    "http://u:pw123@h:1/x",)}, "hf_token": None, "waited_seconds": "240.0"}
    assert redact_json(evidence) == {
        "lines": ["hub_token='***' step 3", "fine"], "count": 2,
        "nested": {"api_key": "***", "max_tokens": "100", "urls": ("http://***@h:1/x",)},
        "hf_token": None, "waited_seconds": "240.0"}


# ----- properties ----------------------------------------------------------------------------
# real swift / HF / vLLM flag names that hold no secret, the tricky ones included
FLAGS = ["model", "model_type", "tokenizer", "max_new_tokens", "max_length", "max_tokens",
         "num_key_value_heads", "key_value_dim", "use_cache", "token_type_ids", "lazy_tokenize",
         "new_special_tokens", "average_tokens_across_devices", "include_num_input_tokens_seen",
         "model_author", "vera_projection_prng_key", "reft_layer_key", "teacher_tag_key",
         "vllm_server_pass_dataset", "pad_token", "eos_token", "rlhf_type", "num_generations",
         "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
         "vllm_server_host", "vllm_server_port", "vllm_gpu_memory_utilization", "use_vllm",
         "vllm_mode", "deepspeed", "offload_model", "sleep_level", "dataset", "output_dir",
         "logging_steps", "save_steps", "report_to", "system", "temperature", "top_p",
         "max_completion_length", "reward_funcs", "external_plugins", "torch_dtype", "seed"]
WORDS = ["loss", "grad_norm", "step", "epoch", "Train:", "it/s", "INFO", "WARNING", "[rank0]:",
         "throughput:", "tokens/s", "Running:", "reqs", "KV", "cache", "usage:", "Saving",
         "checkpoint", "to", "rollout", "server", "passed", "author", "keyboard", "Asia/Shanghai",
         "|████▌", "██|", "[01:23<01:42,", "Avg", "prompt", "generation", "tokens", "keys"]
NUMBERS = st.one_of(st.integers(0, 10**9).map(str),
                    st.floats(0, 1e6, allow_nan=False).map(lambda f: f"{f:.4g}"))
SEGMENT = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,11}", fullmatch=True)
PATHS = st.lists(SEGMENT, min_size=1, max_size=5).map(lambda parts: "/" + "/".join(parts))
URLS = st.tuples(st.sampled_from(["http", "https", "s3"]), st.sampled_from(
    ["10.0.0.5:8000", "localhost", "huggingface.co", "bucket"]), PATHS).map(
    lambda t: f"{t[0]}://{t[1]}{t[2]}")
VALUES = st.one_of(NUMBERS, PATHS, URLS, st.sampled_from(["true", "False", "None", "grpo",
                                                          "Qwen/Qwen2.5-7B-Instruct"]))
FLAG_NAMES = st.sampled_from(FLAGS)
FRAGMENTS = st.one_of(
    st.sampled_from(WORDS), NUMBERS, PATHS, URLS,
    st.tuples(FLAG_NAMES, VALUES).map(lambda t: f"--{t[0]} {t[1]}"),
    st.tuples(FLAG_NAMES, VALUES).map(lambda t: f"--{t[0]}={t[1]}"),
    st.tuples(FLAG_NAMES, VALUES).map(lambda t: f"{t[0]}={t[1]}"),
    st.tuples(FLAG_NAMES, VALUES).map(lambda t: f"'{t[0]}': {t[1]}"),
    st.tuples(FLAG_NAMES, VALUES).map(lambda t: f'"{t[0]}": "{t[1]}"'),
    st.tuples(FLAG_NAMES, VALUES).map(lambda t: f"{t[0]}: {t[1]}"))
SEPARATORS = st.sampled_from([" ", "  ", ", ", "\t", " | ", "; ", "\n", " (", ") "])


@st.composite
def plain_text(draw: st.DrawFn) -> str:
    fragments = draw(st.lists(FRAGMENTS, max_size=12))
    return "".join(f + draw(SEPARATORS) for f in fragments)


PASSWORD = st.from_regex(r"[A-Za-z0-9!#%+^_~.]{8,24}", fullmatch=True).filter(
    lambda v: any(c.isalpha() for c in v) and not v.startswith(("-", "~/", "./", "/")))
ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
B64URL = ALNUM + "-_"


def _chars(alphabet: str, low: int, high: int) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=low, max_size=high)


# each: a secret value, and the text it appears in
SECRETS = {
    "hf": _chars(ALNUM, 34, 34).map(lambda v: ("hf_" + v, "hf_" + v)),
    "openai": _chars(B64URL, 20, 60).map(lambda v: ("sk-proj-" + v, "sk-proj-" + v)),
    "github": st.tuples(st.sampled_from("pousr"), _chars(ALNUM, 36, 36)).map(
        lambda t: (f"gh{t[0]}_{t[1]}",) * 2),
    "github_pat": _chars(ALNUM + "_", 22, 82).map(lambda v: ("github_pat_" + v,) * 2),
    "aws": st.tuples(st.sampled_from(["AKIA", "ASIA"]), _chars(ALNUM[:26] + ALNUM[52:], 16, 16))
    .map(lambda t: (t[0] + t[1],) * 2),
    "slack": st.tuples(st.sampled_from("abposr"), _chars(ALNUM + "-", 10, 50)).map(
        lambda t: (f"xox{t[0]}-{t[1]}",) * 2),
    "jwt": st.tuples(_chars(B64URL, 10, 40), _chars(B64URL, 10, 80), _chars(B64URL, 0, 43)).map(
        lambda t: (f"eyJ{t[0]}.eyJ{t[1]}.{t[2]}",) * 2),
    "url": st.tuples(st.sampled_from(["http", "https", "redis", "postgresql"]), PASSWORD).map(
        lambda t: (t[1], f"{t[0]}://trainer:{t[1]}@10.0.0.5:8000/v1")),
    "bearer": _chars(ALNUM, 12, 40).map(lambda v: (v + "9.x", f"Bearer {v}9.x")),
    "header": PASSWORD.map(lambda v: (v, f"Authorization: Basic {v}")),
    "flag": st.tuples(st.sampled_from(["--hub_token", "--hf-token", "--api_key", "--password",
                                       "--pass", "--pwd", "--swanlab_secret", "-p"]), PASSWORD).map(
        lambda t: (t[1], f"{t[0]} {t[1]}")),
    "assign": st.tuples(st.sampled_from(["api_key", "HF_TOKEN", "WANDB_API_KEY", "password",
                                         "clientSecret", "db.passwd", "token", "--pass"]),
                        st.sampled_from(["=", " = ", ": ", ":"]), PASSWORD).map(
        lambda t: (t[2], f"{t[0]}{t[1]}{t[2]}")),
    "json": st.tuples(st.sampled_from(["api_key", "apiKey", "token", "password", "secret"]),
                      st.sampled_from(['"', "'"]), PASSWORD).map(
        lambda t: (t[2], f"{t[1]}{t[0]}{t[1]}: {t[1]}{t[2]}{t[1]}")),
}


@settings(max_examples=300, deadline=None)
@given(plain_text())
def test_text_without_secrets_is_left_alone(text):
    assert redact_text(text) == text


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(FLAG_NAMES, VALUES), max_size=10))
def test_command_lines_without_secrets_are_left_alone(pairs):
    argv = ["swift", "rlhf", *(word for flag, value in pairs for word in (f"--{flag}", value))]
    assert redact_argv(argv) == argv


@pytest.mark.parametrize("shape", sorted(SECRETS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_no_secret_survives_anywhere_in_text(shape, data):
    secret, fragment = data.draw(SECRETS[shape])
    before, after = data.draw(plain_text()), data.draw(plain_text())
    assume(secret not in before + after)
    text = before + fragment + data.draw(SEPARATORS) + after
    out = redact_text(text)
    assert secret not in out
    assert redact_text(out) == out          # redacting again changes nothing
    assert redact_text(before) == before    # and the text around it was not secret


@pytest.mark.parametrize("shape", ["flag", "hf", "url", "json", "assign"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_no_secret_survives_in_a_command_line(shape, data):
    secret, fragment = data.draw(SECRETS[shape])
    words = data.draw(st.lists(st.tuples(FLAG_NAMES, VALUES), max_size=4))
    plain = ["python", "train.py", *(w for flag, value in words for w in (f"--{flag}", value))]
    assume(all(secret not in word for word in plain))
    argv = plain + (fragment.split(" ", 1) if shape == "flag" else [fragment])
    assert secret not in "\n".join(redact_argv(argv))
