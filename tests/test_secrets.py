"""The built-in redactor (toollatch.relay.redact_secrets) against the common secret formats.

Every sample is built by concatenation at run time (``_j``), so this file holds no string a
secret scanner would flag; each is shaped as the provider issues it (prefix, alphabet,
length), the facts of gitleaks' and detect-secrets' public rule sets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toollatch.core._secrets import _NEEDLES, SECRET_TEXT, holds_secret
from toollatch.relay import redact_secrets
from toollatch.runtime import redact_result


def _j(*parts: str) -> str:
    return "".join(parts)


_B62 = "aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xY"  # 32 characters of [A-Za-z0-9]
FORMATS = {
    "aws_access_key_id": _j("AKI", "A", "Z3QW7RT2XC5VB8NM"),
    "aws_temporary_key_id": _j("ASI", "A", "Z3QW7RT2XC5VB8NM"),
    "google_api_key": _j("AI", "za", "Sy", "D3f4G5h6J7k8L9z0X1c2V3b4N5m6Q7w8E9"),
    "google_oauth_token": _j("ya", "29.", _B62[:24]),
    "github_classic_pat": _j("gh", "p_", _B62, "1234"),
    "github_oauth": _j("gh", "o_", _B62, "1234"),
    "github_server": _j("gh", "s_", _B62, "1234"),
    "github_fine_grained_pat": _j("github", "_pat_", "11ABCDEFG0", "_", _B62, _B62),
    "gitlab_pat": _j("gl", "pat-", _B62[:20]),
    "slack_bot": _j("xo", "xb-", "1234567890-1234567890123-", _B62[:24]),
    "slack_user": _j("xo", "xp-", "1234567890-1234567890123-", _B62[:24]),
    "slack_webhook": _j("https://hooks.", "slack.com/services/", "T0000/B0000/", _B62[:24]),
    "openai_key": _j("s", "k-", "proj-", _B62, _B62[:16]),
    "anthropic_key": _j("s", "k-", "ant-api03-", _B62, _B62),
    "stripe_live": _j("s", "k_", "live_", _B62[:24]),
    "sendgrid": _j("S", "G.", _B62[:22], ".", _B62, _B62[:11]),
    "npm_token": _j("np", "m_", _B62, "abcd"),
    "pypi_token": _j("py", "pi-", "AgEIcHlwaS5vcmc", _B62, _B62),
    "huggingface": _j("h", "f_", _B62, "ab"),
    "jwt": _j("ey", "JhbGciOiJIUzI1NiJ9", ".", "ey", "JzdWIiOiIxMjM0In0", ".sig"),
    "pem_rsa_private_key": _j("-----BEGIN RSA ", "PRIVATE KEY-----\nMIIE...\n"),
    "pem_private_key": _j("-----BEGIN ", "PRIVATE KEY-----\nMIIE...\n"),
    "openssh_private_key": _j("-----BEGIN OPENSSH ", "PRIVATE KEY-----\nb3Bl...\n"),
    "pgp_private_key": _j("-----BEGIN PGP ", "PRIVATE KEY BLOCK-----\n"),
    "url_credentials": _j("postgres://app:", "hunter2", "@db.internal:5432/app"),
    "bearer_header": _j("Authorization: Bear", "er ", _B62),
    "password_assignment": _j("mysql -u root --pass", "word=", "hunter2"),
    "password_in_env_text": _j("DB_PASS", "WORD=", "hunter2\nHOME=/root"),
    "api_key_json_text": _j('{"api', '_key": "', "abc123", '"}'),
    "token_yaml_text": _j("auth:\n  tok", "en: ", "s3cr3tvalue"),
    "secret_assignment": _j("CLIENT_SEC", "RET=", "abcdef"),
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_is_masked_whole(name: str) -> None:
    text = FORMATS[name]
    assert redact_secrets("/q", text) == "[redacted]"
    # inside other text too, and inside a JSON result under an innocent key
    assert redact_secrets("/note", f"see {text} here") == "[redacted]"
    assert text not in redact_result('{"note": ' + _quoted(text) + "}", redact_secrets)


def _quoted(text: str) -> str:
    import json

    return json.dumps(text)


@pytest.mark.parametrize(
    "key",
    [
        "password", "PASSWORD", "Password", "db_password", "passwd", "secret", "clientSecret",
        "token", "accessToken", "ACCESS_TOKEN", "api_key", "apiKey", "API-KEY", "x-api-key",
        "access_key", "private_key", "privateKey", "Authorization", "credentials", "cookie",
        "session_id",
    ],
)  # fmt: skip
def test_a_value_under_a_secret_key_is_masked_in_any_case(key: str) -> None:
    assert redact_secrets(f"/config/{key}", "plain") == "[redacted]"
    assert "plain" not in redact_result('{"' + key + '": "plain"}', redact_secrets)


@pytest.mark.parametrize(
    ("pointer", "text"),
    [
        ("/city", "Oslo"),
        ("/path", "notes/today.md"),
        ("/home", "/home/ana"),
        ("/url", "https://example.com:8080/a@b"),
        ("/git", "ssh://git@github.com/org/repo.git"),
        ("/text", "The tokens used were 120; the password policy needs 12 characters."),
        ("/n", "AKIA"),  # a prefix alone is no key
        ("", "password"),  # a key itself is shown (only the value under it is masked)
    ],
)
def test_ordinary_text_is_shown(pointer: str, text: str) -> None:
    assert redact_secrets(pointer, text) == text


# The pre-filter (holds_secret) against the judge (SECRET_TEXT.search): the same answer on
# text built from the formats' pieces, cut and joined anywhere, in any case, with the
# characters re.IGNORECASE folds to ASCII letters (U+0130, U+0131, U+017F, U+212A).
_PIECES = [
    *(text for text in FORMATS.values()),
    *(t[: len(t) // 2] for t in FORMATS.values()),
    *(t[len(t) // 3 :] for t in FORMATS.values()),
    "://", "a:", "@", "=", ": ", '"', "'", " ", "\n", "_", "-", ".", "/", "k", "K",
    "\u0130", "\u0131", "\u017f", "\u212a", "é", "✓", "pass", "word", "api", "key", "auth",
    "token", "client", "secret", "x" * 20, _B62, "AKIA", "ASIA", "bearer ", "basic\t",
]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=8), st.data())
def test_the_pre_filter_answers_as_the_full_search(pieces: list[str], data: st.DataObject) -> None:
    text = "".join(pieces)
    if text:
        cut = data.draw(st.integers(0, len(text)))
        text = text[cut:] if data.draw(st.booleans()) else text[:cut]
        if data.draw(st.booleans()):
            text = text.swapcase() if data.draw(st.booleans()) else text.upper()
    assert holds_secret(text) == (SECRET_TEXT.search(text) is not None)


_EDGES = [
    # each needle at each distance from the match's start, and the URL's widest window
    _j("client_sec", "ret=ab"), _j("clientsec", "ret=ab"), _j("auth-to", "ken: xy"),
    _j("authto", "ken=xy"), _j("api_k", "ey=xx"), _j("apik", "ey=xx"), _j("access-k", "ey=x1"),
    _j("accessk", "ey=x1"), _j("private_k", "ey=x1"), _j("privatek", "ey=x1"),
    _j("pw", "d=ab"), _j("PASS", "WD: ab"), _j("s", "k-", _B62), _j("r", "k_", _B62[:14]),
    _j("gh", "o-", _B62[:14]), _j("p", "k_test_", _B62[:12]),
    _j("a", "1" * 20, "://", "u" * 256, ":", "p" * 256, "@"),  # the longest scheme
    _j("x a" * 10, "b://u:p@h"),  # the scheme's shortest
    _j("AK\u0130", "AZ3QW7RT2XC5VB8NM"), _j("\u017f", "k-", _B62),
    _j("p\u212a", "_live_", _B62[:24]),
    _j("\u017fecret", "=ab"), _j("toKen", "=ab"), _j("A\u0131", "za", _B62, "abc"),
    _j("gh\u017f", "_", _B62, "abcd"),
    _j("\u0131", "://u:p@h"), _j("pass", "\u0131", "on=", "ab"),
]  # fmt: skip


@pytest.mark.parametrize("text", _EDGES)
def test_the_pre_filter_at_each_needle_distance(text: str) -> None:
    expected = SECRET_TEXT.search(text) is not None
    assert holds_secret(text) == expected
    assert holds_secret(f"{text} and more") == (SECRET_TEXT.search(f"{text} and more") is not None)


def test_the_edges_hold_secrets() -> None:
    # the cases above are secrets (but the last two): so an agreement is not a vacuous one
    assert [holds_secret(text) for text in _EDGES] == [True] * (len(_EDGES) - 2) + [False] * 2


def test_no_needle_hides_another() -> None:
    # the needle search finds one needle per position: none may begin another
    for a in _NEEDLES:
        for b in _NEEDLES:
            assert a == b or not b.startswith(a), (a, b)


def test_the_judge_is_asked_only_where_a_needle_sits(monkeypatch: pytest.MonkeyPatch) -> None:
    # the linear cost, checked by structure rather than a clock: a long text with no needle
    # never reaches the full regex, and a secret at its end is found by one anchored match
    import toollatch.core._secrets as secrets

    starts: list[int] = []
    judge = SECRET_TEXT

    class Counting:
        def match(self, text: str, pos: int = 0) -> object:
            starts.append(pos)
            return judge.match(text, pos)

    monkeypatch.setattr(secrets, "SECRET_TEXT", Counting())
    text = "2026-12-02T01:02:03Z worker-7 fetched page 12 of the report in 0.4 s\n" * 4000
    assert redact_secrets("/log", text) == text
    assert starts == []
    assert redact_secrets("/log", text + FORMATS["openai_key"]) == "[redacted]"
    assert starts == [len(text)]
