"""Amazon Bedrock ConverseStream requests: body, endpoint, credentials and SigV4 (no I/O).

Reference: https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStream.html
(``POST /model/{modelId}/converse-stream``; the body's ``messages``, ``system``,
``toolConfig`` and ``inferenceConfig``; the answer is ``application/vnd.amazon.eventstream``).

Credentials, first found wins (as the AWS SDKs read them):

* a Bedrock API key: ``api_key=`` or ``AWS_BEARER_TOKEN_BEDROCK``, sent as
  ``Authorization: Bearer`` (https://docs.aws.amazon.com/bedrock/latest/userguide/api-keys-use.html);
* ``AWS_ACCESS_KEY_ID`` + ``AWS_SECRET_ACCESS_KEY`` (+ ``AWS_SESSION_TOKEN``): each request is
  signed with Signature Version 4 for the service ``bedrock`` by botocore's own signer (the
  ``[bedrock]`` extra), in the region of the endpoint's host
  (``bedrock-runtime.<region>.amazonaws.com``), else ``AWS_REGION`` / ``AWS_DEFAULT_REGION``.

The endpoint: ``base_url=``, else ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME`` (boto3's variable for
this service), else ``https://bedrock-runtime.<region>.amazonaws.com``. An AWS host without
credentials is refused before anything is sent; another host (the scripted server, a gateway)
gets what there is, nothing included.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from ...core._errors import ConfigError

Signer = Callable[[str, bytes], dict[str, str]]
"""Takes a request's URL and body; returns the headers that sign it."""

BEARER_VARIABLE = "AWS_BEARER_TOKEN_BEDROCK"
"""The variable holding a Bedrock API key."""
ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL_BEDROCK_RUNTIME"
"""boto3's variable overriding the bedrock-runtime endpoint."""
SERVICE = "bedrock"
"""The SigV4 service name of bedrock-runtime (its signing name)."""
EXTRA_HINT = "pip install 'toollatch[bedrock]'"

_REGION_HOST = re.compile(r"bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?")


def path(model: str) -> str:
    """``/model/{modelId}/converse-stream``, the id (a name, or an ARN with ``/`` and ``:``)
    percent-encoded as one path segment, as boto3 sends it."""
    return f"/model/{quote(model, safe='')}/converse-stream"


def is_aws_host(base_url: str) -> bool:
    """Whether ``base_url`` is an AWS endpoint (credentials required)."""
    host = urlsplit(base_url).hostname or ""
    return host.endswith((".amazonaws.com", ".amazonaws.com.cn"))


def region(base_url: str, env: Mapping[str, str]) -> str | None:
    """The region: the endpoint host's, else ``AWS_REGION``, else ``AWS_DEFAULT_REGION``."""
    match = _REGION_HOST.fullmatch(urlsplit(base_url).hostname or "")
    if match is not None:
        return match.group(1)
    return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None


def default_base_url(env: Mapping[str, str]) -> str:
    """``https://bedrock-runtime.<region>.amazonaws.com`` for the environment's region."""
    name = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not name:
        where = f"pass base_url or set {ENDPOINT_VARIABLE}"
        raise ConfigError(f"bedrock: no region: set AWS_REGION (or {where})")
    return f"https://bedrock-runtime.{name}.amazonaws.com"


def auth(
    base_url: str, api_key: str | None, env: Mapping[str, str]
) -> tuple[str | None, Signer | None]:
    """(bearer key, signer) for ``base_url``: one of them, or neither (see the module
    docstring). Raises ConfigError for an AWS host without credentials, a missing region,
    or SigV4 without botocore."""
    key = api_key or env.get(BEARER_VARIABLE) or None
    if key is not None:
        return key, None
    key_id, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if key_id and secret:
        where = region(base_url, env)
        if where is None:
            raise ConfigError("bedrock: SigV4 signing needs a region: set AWS_REGION")
        return None, sigv4_signer(key_id, secret, env.get("AWS_SESSION_TOKEN"), where)
    if is_aws_host(base_url):
        raise ConfigError(
            f"bedrock: no credentials for {base_url}: set {BEARER_VARIABLE} (an API key) or "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or pass api_key"
        )
    return None, None


def sigv4_signer(key_id: str, secret: str, token: str | None, where: str) -> Signer:
    """A signer of requests to bedrock-runtime in region ``where``, by botocore's SigV4Auth
    (a fresh ``X-Amz-Date`` per request). Raises ConfigError when botocore is missing."""
    try:
        from botocore.auth import SigV4Auth  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415
        from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415
        from botocore.credentials import Credentials  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415
    except ImportError:
        raise ConfigError(
            f"bedrock: signing requests with AWS keys needs botocore: {EXTRA_HINT}"
        ) from None
    signer: Any = SigV4Auth(Credentials(key_id, secret, token), SERVICE, where)

    def sign(url: str, body: bytes) -> dict[str, str]:
        request: Any = AWSRequest(
            method="POST", url=url, data=body, headers={"Content-Type": "application/json"}
        )
        signer.add_auth(request)
        names = ("Authorization", "X-Amz-Date", "X-Amz-Security-Token")
        return {name: request.headers[name] for name in names if name in request.headers}

    return sign


def body(
    history: list[Any],
    system: str | None,
    tools: list[dict[str, Any]],
    max_tokens: int | None,
) -> dict[str, Any]:
    """The ConverseStream body: ``messages`` (the history as given), ``system`` as one text
    block, ``toolConfig.tools`` (each ``toolSpec`` with its ``inputSchema.json``) and
    ``inferenceConfig.maxTokens``. ``tools``: ``{"name", "description", "parameters"}``."""
    out: dict[str, Any] = {"messages": history}
    if system is not None:
        out["system"] = [{"text": system}]
    if tools:
        specs = []
        for tool in tools:
            spec: dict[str, Any] = {"name": tool["name"]}
            if tool["description"]:  # (Bedrock refuses an empty one)
                spec["description"] = tool["description"]
            spec["inputSchema"] = {"json": tool["parameters"]}
            specs.append({"toolSpec": spec})
        out["toolConfig"] = {"tools": specs}
    if max_tokens is not None:
        out["inferenceConfig"] = {"maxTokens": max_tokens}
    return out
