"""The built-in redactor: strings that are, or sit under a key that names, a secret (internal;
public as :func:`toollatch.relay.redact_secrets`).

A redactor gets ``(pointer, text)`` for every string of a JSON value (keys too, with the
pointer of their object; see :class:`~toollatch.PreviewPolicy`) and returns what may be shown.
This one masks a string *whole* (``[redacted]``) when

* its key names a secret, in any case and spelling: ``password``, ``passwd``, ``secret``,
  ``token``, ``api_key`` / ``apiKey`` / ``x-api-key``, ``access_key``, ``private_key``,
  ``auth`` / ``authorization``, ``credential``, ``cookie``, ``session_id``; or
* the text holds something shaped like a credential: the token formats of the common
  providers, a PEM private key, credentials in a URL, an ``Authorization`` value, or
  ``password=...`` / ``"token": "..."`` assignments inside the text (a command line, a
  config file's content).

A whole string rather than the matched span: a partly masked string could still show part
of a secret whose format the pattern does not know to the end, and the shape of what is left
says little anyway. Keys are never masked (they are the structure a reader needs), only the
values under them. It is pattern-based, so it errs towards masking (``author`` is masked as
an ``auth`` key) and still cannot know every format: a deployment with its own secrets adds
its own redactor in front of this one.

The formats are those of the public rule sets of secret scanners (the ideas, not their
code): gitleaks' ``config/gitleaks.toml`` (https://github.com/gitleaks/gitleaks) and Yelp's
detect-secrets plugins (https://github.com/Yelp/detect-secrets, ``detect_secrets/plugins``:
``keyword.py``, ``private_key.py``, ``basic_auth.py``, one module per provider).
"""

from __future__ import annotations

import re

from ._preview import REDACTED

SECRET_KEY = re.compile(
    r"pass(?:wo?r?d)?|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|auth"
    r"|credential|cookie|session[_-]?id",
    re.IGNORECASE,
)
"""A key (the last step of a pointer) whose value is masked, matched anywhere in the key."""

_URL_CREDENTIALS = r"[A-Za-z][A-Za-z0-9+.-]{1,20}://[^\s/:@]{1,256}:[^\s/@]{1,256}@"
_FORMATS = (
    # AWS access key ids (the key's class in the first four letters)
    r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b",
    r"\bAIza[0-9A-Za-z_-]{35}",  # Google API key
    r"\bya29\.[0-9A-Za-z_-]{20,}",  # Google OAuth access token
    r"\bgh[pousr]_[A-Za-z0-9]{36,}",  # GitHub tokens: personal, OAuth, user, server, refresh
    r"\bgithub_pat_[A-Za-z0-9_]{22,}",  # GitHub fine-grained personal access token
    r"\bglpat-[A-Za-z0-9_-]{20,}",  # GitLab personal access token
    r"\bxox[abposre]-[A-Za-z0-9-]{10,}",  # Slack bot, user, app... tokens
    r"hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9/+_-]{20,}",  # Slack webhook
    r"\bsk-[A-Za-z0-9_-]{20,}",  # OpenAI (sk-, sk-proj-) and Anthropic (sk-ant-) keys
    r"\b[spr]k_(?:live|test)_[A-Za-z0-9]{10,}",  # Stripe secret, publishable, restricted
    r"\b(?:sk|pk|rk|gho|ghp)[-_][A-Za-z0-9_-]{12,}",  # the older rule's shapes, kept
    r"\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}",  # SendGrid
    r"\bnpm_[A-Za-z0-9]{36}",  # npm access token
    r"\bpypi-AgE[A-Za-z0-9_-]{50,}",  # PyPI upload token (a macaroon)
    r"\bhf_[A-Za-z0-9]{30,}",  # Hugging Face
    r"\bdop_v1_[a-f0-9]{64}",  # DigitalOcean
    r"\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}",  # a JWT (header.payload...)
    r"-----BEGIN[A-Z ]{0,24} PRIVATE KEY(?: BLOCK)?-----",  # PEM / OpenSSH / PGP private key
    _URL_CREDENTIALS,  # user:password@ in a URL
    r"\b(?:bearer|basic)\s+[A-Za-z0-9._~+/-]{16,}=*",  # an Authorization value
    # an assignment in text: password=..., "api_key": "...", token: ...
    r"(?:passw(?:o?r?d)|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|client[_-]?secret|auth[_-]?token)[\"']?\s*[:=]\s*[\"']?[^\s\"',;&]{2,}",
)
SECRET_TEXT = re.compile("|".join(f"(?:{f})" for f in _FORMATS), re.IGNORECASE)
"""Text that holds a credential (any of the formats above, case-insensitive: an upper-case
``AKIA`` id is matched as a lower-case one would be, erring towards masking). It is the
judge; :func:`holds_secret` asks it only where a match can start."""

# The pre-filter. ``SECRET_TEXT.search`` tries its 21 case-insensitive alternatives at every
# position (about 1 us per character: 1 s for a 1 MiB result). Every match of every format
# holds one of these literal needles, at one of the listed distances from where the match
# starts; one case-sensitive search for the needles in the text folded to lower case finds
# the few places worth asking, and ``SECRET_TEXT.match`` there decides, so the answer is
# the judge's own. The folding keeps every character at its index: ``str.lower`` does,
# except for U+0130 (two characters), replaced first, with the two other characters that
# ``re.IGNORECASE`` matches to an ASCII letter and ``str.lower`` keeps (U+0131 for ``i``,
# U+017F for ``s``; U+212A, the Kelvin sign, lowers to ``k`` itself).
_NEEDLES: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(
        ("akia", "asia", "abia", "acca", "agpa", "aida", "aroa", "anpa", "anva", "aipa"), (0,)
    ),  # AWS
    **dict.fromkeys(("aiza", "ya29.", "github_pat_", "glpat-", "xox", "sg.", "npm_"), (0,)),
    **dict.fromkeys(("pypi-age", "hf_", "dop_v1_", "eyj", "-----begin", "bearer", "basic"), (0,)),
    **dict.fromkeys(("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "gho-", "ghp-"), (0,)),  # GitHub
    "hooks.slack.com/": (0,),
    "k-": (1,),  # sk-, and the older sk / pk / rk rule
    "k_": (1,),  # Stripe's [spr]k_live_ / _test_, and the older rule
    # the assignments: passw..., pwd, secret, token, api_key, access-key, private_key
    # (separators optional); client_secret= and auth_token= hold a secret= and a token=
    "passw": (0,),
    "pwd": (0,),
    "secret": (0,),
    "token": (0,),
    "key": (3, 4, 6, 7, 8),
}
_URL_NEEDLE = "://"
_NEEDLE = re.compile(
    "|".join(re.escape(n) for n in sorted([*_NEEDLES, _URL_NEEDLE], key=len, reverse=True))
)
_URL = re.compile(_URL_CREDENTIALS, re.IGNORECASE)
"""Credentials in a URL: the match starts 2 to 21 characters before its ``://`` and ends at
most 514 after it, and holds no anchor, so a search in that window decides."""
_SHORT = 6
_FOLD = re.compile("[\u0130\u0131\u017f]")
_FOLD_TABLE = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s"})


def holds_secret(text: str) -> bool:
    """Whether ``SECRET_TEXT.search(text)`` finds a match, in time linear in ``text``."""
    if len(text) < _SHORT:  # (a key, a flag: the judge alone is cheaper than folding)
        return SECRET_TEXT.search(text) is not None
    folded = text
    if not text.isascii() and _FOLD.search(text) is not None:
        folded = text.translate(_FOLD_TABLE)
    folded = folded.lower()
    match = SECRET_TEXT.match
    found = _NEEDLE.search(folded)
    while found is not None:
        at = found.start()
        needle = found.group()
        if needle == _URL_NEEDLE:
            if _URL.search(text, max(at - 21, 0), at + 517):
                return True
        else:
            for back in _NEEDLES[needle]:
                if back <= at and match(text, at - back):
                    return True
        found = _NEEDLE.search(folded, at + 1)
    return False


def redact_secrets(pointer: str, text: str) -> str:
    """The default redactor: a string under a secret-looking key (``password``, ``token``,
    ``api_key``... in any case) or that holds something shaped like a credential (provider
    tokens such as ``sk-...``, ``ghp_...``, ``AKIA...``, ``AIza...``, ``xoxb-...``; a PEM
    private key; ``user:pass@`` in a URL; ``password=...`` in text; a JWT) shows as
    ``[redacted]``; keys (``pointer`` of their object) are shown as they are."""
    last = pointer.rsplit("/", 1)[-1]
    if SECRET_KEY.search(last) or holds_secret(text):
        return REDACTED
    return text
