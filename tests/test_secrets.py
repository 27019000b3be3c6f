"""The built-in redactor (toollatch.relay.redact_secrets) against the common secret formats.

Every sample is built by concatenation at run time (``_j``), so this file holds no string a
secret scanner would flag; each is shaped as the provider issues it (prefix, alphabet,
length), the facts of gitleaks' and detect-secrets' public rule sets."""

from __future__ import annotations

import pytest

from toollatch.relay import redact_secrets
from toollatch.tools._results import redact_result


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
