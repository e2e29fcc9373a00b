"""Secrets out of everything stalldoc stores or shows: command lines, the job's output lines,
findings and messages.

``redact_argv`` keeps a command line's structure (a secret flag's value becomes ``***``, so do
``--flag=value`` and environment-style ``NAME=value`` words) and then runs every argument through
``redact_text``, which finds secrets inside free text: URL credentials (``scheme://***@host``),
private key blocks (PEM, OpenSSH, PGP: from the BEGIN line to the END line), webhook URLs (Slack,
Discord), known token shapes, ``Authorization`` headers and bearer tokens, and the values of
secret-named settings (``name=value``, ``name: value``, ``"name": "value"``, ``--name value``).
``redact_json`` does the same to every string inside a finding's evidence. ``LineRedactor`` is
``redact_text`` for a stream of lines: a private key printed over many lines is hidden from its
BEGIN line to its END line, whatever output chunks the lines came in.

The token shapes follow the detector catalogue of Yelp's detect-secrets (its plugins: private
keys, Slack, Stripe, Twilio, SendGrid, Discord, Mailchimp, Azure storage keys, npm, PyPI,
GitLab, Telegram, Square, Artifactory, JWT, basic auth, keywords;
``tests/test_redact_catalogue.py`` runs
those plugins as the oracle over one real-shaped example of each), written here so that the agent
can import this module inside a job with the standard library only. The high-entropy detectors
are left out on purpose: on training output (hashes, run ids, base64 tensors) they would hide what
the diagnosis needs; a high-entropy value after a secret-looking name is hidden by its name.

A name is secret by its words (split on ``_ - .``, digits and case): its last word is a secret word
(``hf_token``, ``OPENAI_API_KEY``, ``--pass``) or it holds ``password`` / ``secret`` anywhere;
``--tokenizer``, ``--max_new_tokens``, ``--num_key_value_heads`` and ``pad_token`` are not.

The sidecar runs ``redact_text`` on every line the job prints, so it starts with cheap substring
tests (``_HINT_WORDS``) that rule out the lines where nothing can match. Standard library only: the
agent imports this module inside the job when it records an uncaught exception.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Mapping

MASK = "***"

_SECRET_LAST = frozenset({"token", "key", "secret", "password", "passwd", "pwd", "pass",
                          "passphrase", "credential", "credentials", "apikey", "auth"})
_SECRET_ANYWHERE = frozenset({"password", "passwd", "passphrase", "secret"})
# ``pad_token``, ``eos_token``, ``prng_key``, ``tag_key``: named after what they are not
_NOT_SECRET_BEFORE = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask", "prng", "tag",
                                "layer", "sort"})
# common words: alone before a colon in prose (``missing key: x``) they are not a secret's name
_AMBIGUOUS_ALONE = frozenset({"key", "pass", "auth"})
_KEPT_VALUES = frozenset({"", "None", "null", MASK})

# The words each pass needs in the lower-cased line before it runs. Most lines hold none, and a
# substring test, or an expression that starts with a literal, costs a fraction of an alternation
# over the line (a case-insensitive one: ten times more again). A word common in ordinary output
# counts only where its expression confirms it: ``tokens`` and ``key_value`` name no secret.
_SHAPE_WORDS = frozenset({"hf_", "sk-", "gh", "github_pat_", "akia", "asia", "xox", "eyj",
                          "_live_", "sg.", "-us", "npm_", "pypi-", "glpat-", "sq0", "eaaa",
                          "akc"})
# Shapes with no lower-case literal: looked for where the line holds these, as printed (a Twilio
# sid begins AC or SK, a Telegram bot token holds ":AA"), or says "discord" (a bot token alone has
# no mark at all: a scan of every line for its shape would double the cost of every line)
_CASE_WORDS = frozenset({"AC", "SK", ":AA"})
_OPAQUE_WORDS = _CASE_WORDS | {"discord"}
_BLOCK_WORDS = frozenset({"-----begin"})
_NAME_WORDS = frozenset({"pass", "pwd", "secret", "cred", "auth", "token", "key", "-p"})
_CONFIRM = {"token": re.compile(r"token(?![a-z])"), "key": re.compile(r"key(?![a-z])"),
            "-p": re.compile(r"-p(?<![\w.-]-p)[ \t]"), "gh": re.compile(r"gh[pousr]_"),
            "-us": re.compile(r"-us[0-9]"), "sg.": re.compile(r"(?<![a-z0-9])sg\."),
            "hooks": re.compile(r"hooks(?:\.slack\.com/|/)")}
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+")
_URL_USERINFO = re.compile(r"(?P<scheme>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://)"
                           r"[^\s/@'\"<>]+@")
_AUTH_HEADER = re.compile(r"(?i)(?P<head>\b(?:proxy-)?authorization\\?[\"']?[ \t]*[:=][ \t]*"
                          r"\\?[\"']?(?:(?:bearer|basic|token|digest|negotiate|bot)[ \t]+)?)"
                          r"[^\s'\"\\,;]+")
_BEARER = re.compile(r"(?i)\b(?P<head>bearer[ \t]+)"
                     r"(?=[A-Za-z0-9._~+/-]*[\d._~+/-])[A-Za-z0-9._~+/-]{8,}=*")
_TOKEN_SHAPES = re.compile(r"""\b(?:
      hf_[A-Za-z0-9]{16,}
    | sk-[A-Za-z0-9_-]{20,}                         # OpenAI
    | gh[pousr]_[A-Za-z0-9]{20,}
    | github_pat_[A-Za-z0-9_]{20,}
    | (?:AKIA|ASIA)[A-Z0-9]{16}                     # AWS access key ids
    | xox[abposr]-[A-Za-z0-9-]{10,}                 # Slack tokens
    | eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*          # JWT
    | (?:sk|rk)_live_[0-9A-Za-z]{16,}               # Stripe
    | SG\.[\w-]{16,32}\.[\w-]{30,64}               # SendGrid
    | [0-9a-f]{32}-us[0-9]{1,2}                     # Mailchimp
    | npm_[A-Za-z0-9]{36}                           # npm
    | pypi-AgEIcHlwaS5vcmc[\w-]{40,}                # PyPI (a macaroon for pypi.org)
    | glpat-[\w-]{20,}                              # GitLab
    | sq0(?:atp|csp)-[\w-]{22,43} | EAAA[\w-]{60}   # Square
    | AKC[A-Za-z0-9]{10,}                           # Artifactory
    )(?![A-Za-z0-9])""", re.X)
# Shapes with no lower-case literal of their own (``_OPAQUE_WORDS``)
_OPAQUE_SHAPES = re.compile(r"""\b(?:
      (?:AC|SK)[0-9a-f]{32}                          # Twilio account / API key sids
    | [MNO][\w-]{23,25}\.[\w-]{6}\.[\w-]{27,38}     # Discord bot tokens
    | [0-9]{8,10}:AA[\w-]{33}                        # Telegram bot tokens
    )(?![\w-])""", re.X)
_WEBHOOK = re.compile(r"""(?P<head>https?://(?:hooks\.slack\.com/(?:services|workflows|triggers)
    | (?:[\w-]+\.)?discord(?:app)?\.com/api/webhooks)/)[\w/-]+""", re.X | re.I)
# A private key: its BEGIN line, the body, its END line (real newlines, or "\n" escapes inside a
# JSON string: a GCP service account's "private_key"); with no END in the text, to its end
_KEY_BLOCK = re.compile(r"""(?P<begin>-----BEGIN[ ](?P<kind>[A-Z0-9 ]*?PRIVATE[ ]KEY(?:[ ]BLOCK)?)
    -----)(?:.*?(?P<end>-----END[ ](?P=kind)-----)|.*)""", re.X | re.S)
# A name that may be secret (the words decide), then how its value follows. Found without the
# value, so that a name that is not secret never swallows the next one. The stem is looked for in
# a lookahead, which never backtracks: a long word made of stems is scanned once, not once per
# stem. (Python 3.10 compatible: the agent imports this module inside the job's interpreter.)
_NAMED = re.compile(r"""(?<![\w.-])(?P<name>-p
        | -{0,2}(?=[A-Za-z_])(?=[\w.-]*?(?i:pass|pwd|secret|cred|token|key|auth))[\w.-]*)
    (?P<sep>\\?["']?[ \t]*[:=][ \t]*|[ \t]+)""", re.X)
_VALUE = re.compile(r"""(?P<open>\\?["'])(?P<body>(?:\\.|.)*?)(?:(?P<close>(?P=open))|$)
    | (?P<bare>[^\s'"`,;&)\]}]+)""", re.X)
_PORT_OR_PATH = re.compile(r"(?:[\d.]+:)?\d{1,5}(?::\d{1,5})?(?:/(?:tcp|udp))?|(?:/|\.\.?/|~/).*",
                           re.S)
_FLAG = re.compile(r"--?[A-Za-z][\w.-]*")
_ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\S*")


def is_secret_name(name: str) -> bool:
    """Whether a flag, variable or key called ``name`` holds a secret (by its words)."""
    words = [w.lower() for w in _WORD.findall(name)]
    if _SECRET_ANYWHERE.intersection(words):
        return True
    if not words or words[-1] not in _SECRET_LAST:
        return False
    return len(words) < 2 or words[-2] not in _NOT_SECRET_BEFORE


def redact_argv(argv: Iterable[str]) -> list[str]:
    """The command line with every secret replaced by ``***``, one word for one word."""
    out: list[str] = []
    pending: str | None = None   # a secret flag whose value is the next word
    for arg in argv:
        if pending is not None and not arg.startswith("-"):
            out.append(arg if _kept_flag_value(pending, arg) else MASK)
            pending = None
            continue
        word, pending = _redact_word(arg)
        out.append(redact_text(word))
    return out


def redact_text(text: str) -> str:
    """``text`` with every secret found in it replaced by ``***`` (the same object when none)."""
    hints = _hints(text)
    if not hints:
        return text
    for words, redact in _PASSES:
        if not hints.isdisjoint(words):
            text = redact(text)
    return text


class LineRedactor:
    """``redact_text`` line by line, for one stream of output: the lines of a private key printed
    over many lines are hidden from the BEGIN line to the END line (the lines in between have no
    mark of their own). A block ends early at a line that cannot be key material (it does not
    end in base64 and is no ``Name: value`` header), and after ``MAX_KEY_LINES``, so a BEGIN line
    printed alone never hides the rest of the output."""

    def __init__(self) -> None:
        self.in_key = ""         # the kind of the key block the stream is inside ("" outside)
        self.lines = 0           # lines hidden in it so far

    def line(self, text: str) -> str:
        if self.in_key:
            end = f"-----END {self.in_key}-----"
            at = text.find(end)
            if at >= 0:
                self.in_key = ""
                return MASK + redact_text(text[at:])
            self.lines += 1
            if self.lines <= MAX_KEY_LINES and _KEY_LINE.search(text) is not None:
                return MASK
            self.in_key = ""
        redacted = redact_text(text)
        if "-----BEGIN " in text:
            self.in_key, self.lines = _open_key(text), 0
        return redacted


MAX_KEY_LINES = 256      # an RSA 8192 key is about 100 lines of 64 characters
# a line of a key's body (base64, after whatever prefix a launcher adds), a header of an
# encrypted PEM (``Proc-Type: 4,ENCRYPTED``), or a blank line
_KEY_LINE = re.compile(r"[A-Za-z0-9+/]{4,}={0,2}\s*$|^\s*$|^[^:]*[A-Za-z-]+: \S+\s*$")


def _open_key(text: str) -> str:
    """The kind of the private key block ``text`` begins and does not end ("": none open)."""
    kind = ""
    for block in _KEY_BLOCK.finditer(text):
        kind = "" if block["end"] else block["kind"]
    return kind


def redact_json(value: Any) -> Any:
    """A JSON-like value (a finding's evidence) with its strings redacted; a string under a secret
    key is hidden whole."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {key: _redact_entry(key, item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_json(item) for item in value)
    return value


def _redact_entry(key: Any, value: Any) -> Any:
    if isinstance(key, str) and isinstance(value, str) and value not in _KEPT_VALUES \
            and is_secret_name(key):
        return MASK
    return redact_json(value)


def _is_secret_flag(flag: str) -> bool:
    return flag == "-p" or (_FLAG.fullmatch(flag) is not None and is_secret_name(flag))


def _kept_flag_value(flag: str, value: str) -> bool:
    """``-p`` is a port (``8080``, ``8080:80``) or a directory (``mkdir -p``) as often as it is a
    password."""
    return flag == "-p" and _PORT_OR_PATH.fullmatch(value) is not None


def _redact_word(arg: str) -> tuple[str, str | None]:
    """One word of a command line: (what to keep, the secret flag whose value comes next)."""
    name, eq, value = arg.partition("=")
    if _is_secret_flag(name):
        if not eq:
            return arg, name
        return (f"{name}={MASK}" if value else arg), None
    if eq and value and _ENV_WORD.fullmatch(arg) and is_secret_name(name):
        return f"{name}={MASK}", None
    return arg, None


def _redact_named(text: str) -> str:
    """The values of secret-named settings inside ``text``."""
    pieces: list[str] = []
    done = 0
    for named in _NAMED.finditer(text):
        if named.start() < done or not _secret_setting(named):
            continue
        value = _VALUE.match(text, named.end())
        if value is None or _kept_value(named, value):
            continue
        pieces += [text[done:value.start()], _masked(value)]
        done = value.end()
    return "".join(pieces) + text[done:] if pieces else text


def _secret_setting(named: re.Match[str]) -> bool:
    name, sep = named["name"], named["sep"]
    spaced = not sep.strip()
    if spaced and not name.startswith("-"):
        return False     # ``my token is``: prose, not ``--token value``
    if name == "-p":
        return spaced
    if ":" in sep and name.lower() in _AMBIGUOUS_ALONE:
        return False
    return is_secret_name(name)


def _kept_value(named: re.Match[str], value: re.Match[str]) -> bool:
    text = value["bare"] if value["bare"] is not None else value["body"]
    if text in _KEPT_VALUES:
        return True
    if value["bare"] is not None and not named["sep"].strip():
        return text.startswith("-") or _kept_flag_value(named["name"], text)
    return False


def _substitute(pattern: re.Pattern[str], replacement: str) -> Callable[[str], str]:
    return lambda text: pattern.sub(replacement, text)


def _key_block(block: re.Match[str]) -> str:
    """A key block with its body hidden (a BEGIN line with nothing after it stays as it is)."""
    end = block["end"] or ""
    body = block[0][len(block["begin"]):len(block[0]) - len(end)]
    return block[0] if not end and not body.strip() else f"{block['begin']}{MASK}{end}"


_PASSES: tuple[tuple[frozenset[str], Callable[[str], str]], ...] = (
    (_BLOCK_WORDS, lambda text: _KEY_BLOCK.sub(_key_block, text)),
    (frozenset({"hooks"}), _substitute(_WEBHOOK, rf"\g<head>{MASK}")),
    (frozenset({"@"}), _substitute(_URL_USERINFO, rf"\g<scheme>{MASK}@")),
    (frozenset({"auth"}), _substitute(_AUTH_HEADER, rf"\g<head>{MASK}")),
    (frozenset({"bearer"}), _substitute(_BEARER, rf"\g<head>{MASK}")),
    (_SHAPE_WORDS, _substitute(_TOKEN_SHAPES, MASK)),
    (_OPAQUE_WORDS, _substitute(_OPAQUE_SHAPES, MASK)),
    (_NAME_WORDS, _redact_named),
)
_HINT_WORDS = tuple(sorted(frozenset().union(*(words for words, _ in _PASSES)) - _CASE_WORDS))


def _hints(text: str) -> set[str]:
    """The hint words in the line (lower-cased; ``_CASE_WORDS`` as printed); a common one only
    where its expression finds it."""
    found = {word for word in _CASE_WORDS if word in text}
    lower = text.lower()
    found.update(word for word in _HINT_WORDS if word in lower
                 and (word not in _CONFIRM or _CONFIRM[word].search(lower) is not None))
    return found


def _masked(value: re.Match[str]) -> str:
    if value["bare"] is not None:
        return MASK
    return f"{value['open']}{MASK}{value['close'] or ''}"
