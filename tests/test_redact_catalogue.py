"""The secrets a maintained detector catalogue knows (Yelp's detect-secrets, run here as the
oracle): each kind's real-shaped example is found by detect-secrets' own plugin, and after our
redaction neither that plugin nor a plain search finds the secret, while the line's neighbours
stay. Private keys printed over many lines go from the BEGIN line to the END line."""
from __future__ import annotations

import pytest

from secret_kinds import KINDS, PEM, PEM_BODY, Kind
from stalldoc.redact import MASK, LineRedactor, redact_argv, redact_text

from detect_secrets.core.scan import scan_line  # the test extra installs it
from detect_secrets.settings import transient_settings


def found_by(detector: str, line: str) -> list[str]:
    with transient_settings({"plugins_used": [{"name": detector}]}):
        return [s.secret_value for s in scan_line(line)]


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_every_kind_the_catalogue_knows_goes_and_the_line_stays(kind: Kind):
    # GIVEN a line the catalogue's own detector flags (the example is real-shaped)
    if kind.detector:
        assert found_by(kind.detector, kind.line), f"{kind.detector} finds nothing in the example"
    # WHEN it is redacted
    out = redact_text(kind.line)
    # THEN the secret is gone, for us and for the catalogue, and the rest of the line stays
    assert kind.secret not in out and MASK in out
    if kind.detector:
        assert [s for s in found_by(kind.detector, out) if MASK not in s] == []
    assert kind.kept in out


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_every_kind_goes_from_a_command_line_too(kind: Kind):
    argv = ["python", "notify.py", "--message", kind.line, "--max_new_tokens", "512"]
    out = redact_argv(argv)
    assert kind.secret not in " ".join(out) and out[-2:] == ["--max_new_tokens", "512"]


def lines_through(redactor: LineRedactor, lines: list[str]) -> list[str]:
    return [redactor.line(line) for line in lines]


@pytest.mark.parametrize("prefix", ["", "[default0]:", "[rank1]: ", "0: ", "worker-1: "])
def test_a_key_printed_over_many_lines_goes_whole(prefix: str):
    # GIVEN a job that prints a private key line by line, behind a launcher's prefix
    lines = [f"{prefix}{line}" for line in ["loading deploy key:", *PEM, "step 1 loss=0.25"]]
    out = lines_through(LineRedactor(), lines)
    # THEN from its BEGIN line to its END line nothing of it is left, and output goes on after
    assert not [body for body in PEM_BODY for line in out if body in line]
    assert out[0] == lines[0] and out[-1] == lines[-1]
    assert out[1] == f"{prefix}-----BEGIN RSA PRIVATE KEY-----"
    assert out[2:-2] == [MASK] * len(PEM_BODY) and "-----END RSA PRIVATE KEY-----" in out[-2]


def test_an_encrypted_pem_with_headers_goes_whole():
    lines = ["-----BEGIN EC PRIVATE KEY-----", "Proc-Type: 4,ENCRYPTED",
             "DEK-Info: AES-128-CBC,2AF25325A9B286F4CBD8AB8D3A0A8A5D", "", *PEM_BODY,
             "-----END EC PRIVATE KEY-----"]
    out = lines_through(LineRedactor(), lines)
    assert out[1:-1] == [MASK] * (len(lines) - 2)


def test_a_begin_line_alone_does_not_hide_the_output_after_it():
    # a job that prints a key's first line and then goes on with ordinary output
    lines = ["-----BEGIN OPENSSH PRIVATE KEY----- (truncated)", "Train:  1%|   | 1/100 [00:01<]",
             "{'loss': 0.25, 'global_step/max_steps': '1/100'}"]
    out = lines_through(LineRedactor(), lines)
    assert out[1:] == lines[1:]


def test_each_stream_keeps_its_own_block():
    from stalldoc.model.samples import LogLine
    from stalldoc.sidecar.log_feed import LogFeed
    feed = LogFeed()
    printed = [("stdout", PEM[0]), ("stderr", "[W] NCCL warning: slow link"), ("stdout", PEM[1]),
               ("stderr", "Train: 2%|"), ("stdout", PEM[2]), ("stdout", PEM[-1])]
    for t, (stream, text) in enumerate(printed):
        feed.put(LogLine(float(t), stream, text))
    texts = [line.text for line in feed.drain().lines]
    assert texts[1] == "[W] NCCL warning: slow link" and texts[3] == "Train: 2%|"
    assert texts[2] == texts[4] == MASK and PEM[1] not in " ".join(texts)


def test_a_key_in_one_string_with_real_newlines_goes_whole():
    text = "RuntimeError: bad key\n" + "\n".join(PEM) + "\nwhile loading"
    out = redact_text(text)
    assert not [b for b in PEM_BODY if b in out] and out.endswith("\nwhile loading")
