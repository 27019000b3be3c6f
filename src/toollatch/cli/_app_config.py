"""One validated configuration file (internal; public names in :mod:`toollatch.runtime`).

A YAML file (PyYAML ``safe_load``, duplicate keys refused) plus ``TOOLLATCH_<SECTION>__<KEY>``
environment overrides (the value is read as one YAML scalar or flow value, so ``false``,
``60`` and ``[a, b]`` mean what they say), validated by pydantic in strict mode: an unknown
key, a value of the wrong type or out of range is a :class:`ConfigError` naming the key, the
value and what was expected, one line per problem. Precedence: command-line flags over the
environment over the file over the defaults here. The environment is read with or without
a file (:func:`configured`: ``toollatch run`` and ``serve`` without ``--config`` but with a
``TOOLLATCH_...`` variable run as with an empty file plus the variables).

The sections map onto what the library already takes; each ``Config`` method builds one
of those values, so the file adds no second set of rules:

* ``agent_stream_assemble`` (the seeds' gateway block, names kept): core :class:`Limits`,
  ``RunLimits.call_stall_s``, the eager master switch, previews on/off, the invalid-call
  policy (``drop_with_protocol_repair`` drops a failed call and its result from history);
* ``dispatcher``: :class:`Dispatcher` / :class:`Agent` options;
* ``previews``: :class:`PreviewPolicy`;
* ``model``: :func:`model_client` arguments and :class:`ClientLimits`;
* ``relay``: host, port and the :class:`RunLimits` of each run;
* ``proxy``: ``toollatch proxy`` (every flag of it, and the relay's connection bounds);
* ``ledger``: the ledger URL and the opt-in audit of uncommitted calls (:class:`AuditPolicy`);
* ``results``: the size budgets of tool results (:class:`ResultLimits`);
* ``logging``: the redacted logs of :mod:`toollatch.runtime._telemetry`;
* ``mcp``: ``servers``, a list of MCP servers and their policy (:class:`McpServer`);
* ``approvals``: which calls wait for a person, and how long (:class:`ApprovalPolicy`).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml  # type: ignore[import-untyped]  # (no types-PyYAML in the venv)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core._errors import ConfigError, ErrorCode
from ..core._limits import Limits
from ..core._preview import PreviewPolicy, Redactor, ToolPreview
from ..core._secrets import redact_secrets
from ..ledger import AuditPolicy
from ..mcp._servers import McpServer, parse_server_spec, unique_names
from ..runtime._approvals import MAX_ALWAYS, ApprovalPolicy
from ..runtime._clients import ClientLimits, RetryPolicy
from ..runtime._run_setup import DEFAULT_DEADLINE_S, RunLimits
from ..tools._results import DEFAULT_MAX_RESULT_BYTES, MIN_RESULT_BYTES, ResultLimits

ENV_PREFIX = "TOOLLATCH_"
"""Environment overrides are ``TOOLLATCH_<SECTION>__<KEY>`` (two underscores between)."""

_Positive = Annotated[int, Field(ge=1)]
_Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class AssembleConfig(_Section):
    """The seeds' ``agent_stream_assemble`` block (argument assembly and the gate)."""

    max_tool_argument_bytes: _Positive = 262144
    """-> ``Limits.max_argument_bytes``."""
    max_tool_calls_in_flight_assemble: _Positive = 32
    """-> ``Limits.max_calls_per_round``."""
    assemble_idle_timeout_s: _Seconds | None = 60.0
    """-> ``RunLimits.call_stall_s``: a call open without new argument bytes this long fails
    its round ``idle_timeout`` (null: no limit)."""
    execute_before_stream_end: bool = True
    """Eager master switch (on, as :class:`toollatch.runtime.Agent`'s ``eager_start``): when
    false no call starts before its round ends; when true, tools still need ``eager=True`` or
    the dispatcher's ``eager`` list."""
    ui_forward_partial_args: bool = True
    """Produce previews of calls still streaming (the ``previews`` section says how much)."""
    arguments_must_be_object: Literal[True] = True
    """The gate only commits JSON objects; only true is accepted (stated, not a switch)."""
    on_invalid_json: Literal["error_result", "drop_with_protocol_repair"] = "error_result"
    """A call whose arguments are not strict JSON (``invalid_json``) or not an object
    (``arguments_not_object``): an error result sent to the model, or dropped from the
    history with its result."""
    on_args_overflow: Literal["error_result", "drop_with_protocol_repair"] = "error_result"
    """The same for a call past ``max_tool_argument_bytes``."""
    finalize_order: Literal["provider_index"] = "provider_index"
    """Results are always written in the provider's call order."""


class DispatcherConfig(_Section):
    """Tool execution (:class:`Dispatcher` options)."""

    max_concurrency: _Positive = 8
    default_timeout_s: _Seconds | None = 30.0
    eager: Annotated[tuple[str, ...], Field(strict=False)] = ()
    """More tool names that may start early (with ``execute_before_stream_end``)."""
    session: str = "default"
    """The session lock key: rounds of one session never run tools at once."""


class ToolPreviewConfig(_Section):
    """One tool's preview rule (:class:`ToolPreview`)."""

    mode: Literal["none", "fields", "full"] = "none"
    fields: Annotated[tuple[Annotated[str, Field(pattern=r"^/")], ...], Field(strict=False)] = ()


class PreviewsConfig(_Section):
    """Previews of calls still streaming (:class:`PreviewPolicy`)."""

    default: ToolPreviewConfig = ToolPreviewConfig()
    tools: dict[str, ToolPreviewConfig] = {}
    every_bytes: _Positive = 256
    """Throttle: an update at most every this many argument bytes."""


class ModelConfig(_Section):
    """The model client (:func:`model_client` and :class:`ClientLimits`)."""

    provider: Literal["openai_chat", "openai_responses", "anthropic", "gemini", "bedrock"] = (
        "openai_chat"
    )
    """The wire; ``bedrock`` for ``toollatch run`` only (the relay serves the other four)."""
    model: str | None = None
    """Required with ``base_url``; the scripted server's model otherwise."""
    base_url: str | None = None
    """None: the embedded scripted server (``toollatch run``)."""
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    """The environment variable holding the key (None: the provider's usual one). The key
    itself never goes in the file."""
    max_tokens: _Positive | None = None
    connect_s: _Seconds = 10.0
    first_byte_s: _Seconds = 120.0
    idle_s: _Seconds = 120.0
    max_body_bytes: _Positive = 64 * 1024 * 1024
    """-> ``ClientLimits.max_body_bytes``: body bytes per response, counted decoded (a gzip
    bomb stops here); past it the round's calls fail ``stream_interrupted``."""
    stream_retries: Annotated[int, Field(ge=0)] = 2
    """-> ``RetryPolicy.stream_retries``: rounds whose stream broke that are asked again, in
    a row (0: never)."""


_Names = Annotated[tuple[Annotated[str, Field(min_length=1)], ...], Field(strict=False)]


class RelayConfig(_Section):
    """The relay server, who may drive it, its bounds (:class:`toollatch.relay.RelayLimits`),
    and the budgets of each run (also used by ``toollatch run``)."""

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    max_rounds: _Positive = 8
    max_tool_calls: _Positive = 64
    deadline_s: _Seconds | None = DEFAULT_DEADLINE_S
    """-> ``RunLimits.deadline_s``: wall-clock limit of a whole run (null: none)."""
    token: Annotated[str, Field(pattern=r"^(auto|[A-Za-z0-9._~-]{16,256})$")] | None = None
    """The access token every request must carry (required when ``host`` is not loopback);
    ``auto``: a new one, printed with the URL at start. Better in TOOLLATCH_RELAY__TOKEN."""
    allowed_hosts: _Names = ()
    """``Host`` names accepted besides loopback's and the bound one (``*.example.com``,
    ``*``: any): behind a reverse proxy."""
    allowed_origins: _Names = ()
    """Origins a POST may come from besides the relay's own (``https://relay.example``)."""
    models: _Names | None = None
    """Model names the browser may pick (null: the configured model only; with the
    scripted server, its scripts)."""
    max_active_runs: _Positive = 16
    max_stored_runs: _Positive = 256
    """-> ``RelayLimits.max_stored_runs``: runs kept for resume (raised to
    ``max_active_runs`` if lower); the oldest finished run is forgotten beyond it."""
    max_run_events: _Positive = 20_000
    """-> ``RelayLimits.max_run_events``: events stored per run; a run reaching it is
    cancelled, and only the events that pair its calls and end it are kept past it."""
    max_kept_bytes: _Positive = 1 << 20
    """-> ``RelayLimits.max_kept_bytes``: SSE bytes kept per run for readers and resumes
    (a reader behind the oldest kept gets ``event: lagged``)."""
    max_body_bytes: _Positive = 64 * 1024
    """-> ``RelayLimits.max_body_bytes``: largest request body (413 beyond)."""
    max_message_chars: _Positive = 16_000
    """-> ``RelayLimits.max_message_chars``: longest user message (422 beyond)."""
    heartbeat_s: _Seconds = 15.0
    """-> ``RelayLimits.heartbeat_s``: an SSE comment after this long without an event."""
    sse_batch: _Positive = 64
    """-> ``RelayLimits.sse_batch``: stored events written per send at most."""
    max_session_runs: _Positive = 4
    max_session_readers: _Positive = 8
    max_connections: _Positive = 1000
    max_header_bytes: Annotated[int, Field(ge=1024)] = 65536
    header_timeout_s: _Seconds = 10.0
    idle_timeout_s: _Seconds = 15.0
    body_timeout_s: _Seconds = 30.0
    shutdown_grace_s: _Seconds = 10.0
    """On SIGTERM / SIGINT, how long ``serve`` waits for its cancelled runs to end (their
    event streams get every result and ``run_ended``) before it exits."""
    max_chat_messages: _Positive = 400
    """-> ``RelayLimits.max_chat_messages``: history entries a chat keeps on the server
    (``POST /api/chat``, ``POST /runs {"chat_id"}``); a full chat refuses more (409)."""
    max_chat_body_bytes: _Positive = 1 << 20
    """-> ``RelayLimits.max_chat_body_bytes``: largest ``POST /api/chat`` body (413 beyond;
    ``useChat`` sends the whole conversation each time)."""
    max_ui_bytes: _Positive = 65536
    """-> ``RelayLimits.max_ui_bytes``: largest UI payload (``ToolOutcome.ui``, as JSON,
    redacted) sent to the browser; a larger one is left out (``ui_omitted``)."""
    result_text: Literal["summary", "always", "never"] = "summary"
    """-> ``RelayLimits.result_text``: when the browser gets a redacted preview of a result's
    model-facing text: ``summary`` (no UI payload or a failed call), ``always``, ``never``."""
    approval_secret_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")] | None = (
        None
    )
    """The environment variable holding the key (at least 16 bytes) that signs approval
    tokens (never the key itself in the file); null: a random key per process, so a question
    resumed after a restart gets a new token."""
    store: Annotated[str, Field(pattern=r"^(memory:|(rediss?|unix)://.+)$")] = "memory:"
    """Where the runs live: ``memory:`` (this process only) or ``redis://HOST:PORT/DB``
    (shared by every worker on it: any worker serves, resumes and cancels any run)."""
    store_ttl_s: _Seconds = 3600.0
    """How long a shared store keeps a run's events and metadata after its last event."""
    store_outage_s: _Seconds = 5.0
    """How long a worker retries a write to an unreachable shared store before it cancels
    its runs (their local readers still get every event)."""
    lease_s: _Seconds = 10.0
    """A worker's lease with a shared store, renewed every third of it: a worker silent
    this long is taken as dead, and a surviving worker ends its runs (every call paired)."""
    durable: Annotated[str, Field(pattern=r"^postgres(ql)?://.+$")] | None = None
    """``postgresql://USER@HOST:PORT/DB``: each run is a DBOS workflow (the ``durable``
    extra; needs a Redis ``store`` and a ledger), so a surviving worker finishes a dead
    worker's run instead of ending it; null: none."""


_ProxyBytes = Annotated[int, Field(ge=1)]


class ProxyConfig(_Section):
    """``toollatch proxy``: its upstream, who may use it, how calls reach the client, and its
    bounds (:class:`toollatch.relay.ProxyServer`'s arguments; the connection bounds are the
    relay's, :class:`toollatch.relay.RelayLimits`)."""

    upstream: Annotated[str, Field(pattern=r"^https?://")] | None = None
    """The model server's base URL (``http://HOST:PORT/v1``); required here or as
    ``--upstream``."""
    upstream_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = (
        "TOOLLATCH_PROXY_UPSTREAM_KEY"
    )
    """The environment variable holding the upstream's API key (the key never goes in the
    file); when it is set, the clients' ``Authorization`` is not forwarded."""
    upstream_provider: Literal[
        "openai_chat", "anthropic", "gemini", "openai_responses", "bedrock"
    ] = "openai_chat"
    """The upstream's wire: ``openai_chat`` forwards the request as is; the others translate
    the client's chat request into that provider's and answer in OpenAI chat's format."""
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    calls: Literal["hold", "stream"] = "hold"
    """``hold``: a call is sent once committed, whole; ``stream``: its argument text as it
    streams, the verdicts at the end (a client may see part of a call refused later)."""
    token: Annotated[str, Field(pattern=r"^(auto|[A-Za-z0-9._~-]{16,256})$")] | None = None
    """The token clients must send (required beyond loopback); better in
    TOOLLATCH_PROXY__TOKEN."""
    allowed_hosts: _Names = ()
    """``Host`` names accepted besides loopback's and the bound one."""
    record: str | None = None
    """A folder where each upstream answer is saved as a replayable fixture."""
    idle_timeout_s: _Seconds = 60.0
    """The upstream may stay silent this long mid-stream; then the round fails
    ``idle_timeout``."""
    max_request_bytes: _ProxyBytes = 16 * 1024 * 1024
    max_connections: _Positive = 1000
    max_header_bytes: Annotated[int, Field(ge=1024)] = 65536
    header_timeout_s: _Seconds = 10.0
    keepalive_timeout_s: _Seconds = 15.0
    """An idle keep-alive connection of a client is closed after this (longer than the
    clients' own pools keep theirs: ``RelayLimits.idle_timeout_s``)."""
    body_timeout_s: _Seconds = 30.0


class LedgerConfig(_Section):
    """The durable call ledger, and its opt-in audit of calls that did not commit."""

    url: Annotated[str, Field(pattern=r"^(none|memory:|sqlite:///.+|rediss?://.+)$")] | None = None
    """The ledger when the command line gives none: ``sqlite:///PATH``, ``redis://HOST:PORT/DB``
    or ``none``; null: none for ``run``, SQLite in the user's data folder for ``serve``
    (:func:`~toollatch.ledger.default_ledger_url`)."""
    lease_s: Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)] = 30.0
    """Seconds a claim in the ledger lives unrenewed (``run`` renews it every third while the
    call runs): a call whose process died is taken over (by ``--resume``) after it."""
    audit_uncommitted: bool = False
    """Keep a record of each call that failed the gate or was cut off (in the ledger's store,
    apart from its calls), redacted by the ``previews`` rules: with their default (``none``)
    it holds no argument text, only the name, code and byte count."""
    audit_max_bytes: Annotated[int, Field(ge=0, le=65536)] = 512
    """Most bytes of redacted argument text a record keeps."""
    audit_retention_s: Annotated[float, Field(gt=0, le=3.2e8, allow_inf_nan=False)] = 86400.0
    """Seconds a record is kept."""
    audit_max_per_scope: _Positive = 1000
    """Newest records kept per run or session."""
    redact: bool = False
    """Store arguments and results through the built-in redactor (``redact_secrets``): the
    run history's messages and the ledger's results keep ``[redacted]`` where a secret was
    (a resumed run's model then reads them so, a retried call gets its stored result so)."""


_ResultBytes = Annotated[int, Field(ge=MIN_RESULT_BYTES)]


class ResultsConfig(_Section):
    """The size budgets of tool results in UTF-8 bytes (:class:`ResultLimits`)."""

    max_bytes: _ResultBytes = DEFAULT_MAX_RESULT_BYTES
    """A result longer than this is cut, ending with a marker that states both sizes."""
    tools: dict[str, _ResultBytes] = {}
    """Per-tool budgets by tool name (over the tool's own ``max_result_bytes``)."""


class LoggingConfig(_Section):
    """Redacted logs: never argument values unless a tool's preview rule shows them."""

    format: Literal["text", "json"] = "text"
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class McpServerConfig(_Section):
    """One MCP server (:class:`toollatch.mcp.McpServer`): ``command`` (stdio) or ``url``."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,32}$")] | None = None
    """Default: the command's program name or the URL's host and port."""
    command: Annotated[tuple[str, ...], Field(strict=False, min_length=1)] | None = None
    url: Annotated[str, Field(pattern=r"^https?://")] | None = None
    env: dict[str, str] = {}
    """Variables given to a stdio server (e.g. the one key it needs)."""
    inherit_env: bool = False
    """False: a stdio server starts with a minimal environment (PATH, HOME, the locale...)
    plus ``env``; true: toollatch's whole environment (API keys included)."""
    eager: Annotated[tuple[str, ...], Field(strict=False)] = ()
    timeout_s: _Seconds | None = 30.0
    max_concurrency: _Positive = 4
    allow: Annotated[tuple[str, ...], Field(strict=False)] | None = None
    deny: Annotated[tuple[str, ...], Field(strict=False)] = ()
    connect_timeout_s: _Seconds = 30.0
    max_schema_bytes: _Positive = 65_536
    """Largest ``inputSchema`` of one tool (compact JSON bytes); a larger tool is left out."""
    max_schema_depth: _Positive = 32
    """Deepest nesting in one ``inputSchema``; a deeper tool is left out."""
    max_description_chars: Annotated[int, Field(ge=0)] = 4096
    """A longer tool description is cut to this before the model sees it."""


class McpConfig(_Section):
    """Tools from MCP servers (``toollatch.mcp``; needs the ``mcp`` extra when non-empty)."""

    servers: Annotated[tuple[McpServerConfig, ...], Field(strict=False)] = ()


class ApprovalsConfig(_Section):
    """Calls that wait for a person's approval before they run (:class:`ApprovalPolicy`),
    besides those of tools declared ``needs_approval``: MCP tools need no code for it."""

    tools: _Names = ()
    """Tool names whose calls need approval."""
    default: Literal["run", "ask"] = "run"
    """``ask``: every other tool's calls need it too."""
    timeout_s: _Seconds | None = 300.0
    """An unanswered call fails ``approval_expired`` after this long (null: never)."""
    max_always: Annotated[int, Field(ge=1, le=MAX_ALWAYS)] = 32
    """Tools one session may "always allow" (``approve(..., always=True)``; more: refused)."""


class Config(_Section):
    """The whole configuration; every section is optional (defaults above)."""

    agent_stream_assemble: AssembleConfig = AssembleConfig()
    dispatcher: DispatcherConfig = DispatcherConfig()
    previews: PreviewsConfig = PreviewsConfig()
    model: ModelConfig = ModelConfig()
    relay: RelayConfig = RelayConfig()
    proxy: ProxyConfig = ProxyConfig()
    ledger: LedgerConfig = LedgerConfig()
    results: ResultsConfig = ResultsConfig()
    logging: LoggingConfig = LoggingConfig()
    mcp: McpConfig = McpConfig()
    approvals: ApprovalsConfig = ApprovalsConfig()

    def mcp_servers(self) -> list[McpServer]:
        """The ``mcp.servers`` as :class:`McpServer` values (a name derived from the command
        or URL when none is given; ``_2``... when a derived one repeats). Raises
        ``ConfigError`` for a server with both or neither of command and url, or an
        explicit name given twice."""
        servers = []
        for i, c in enumerate(self.mcp.servers):
            if (c.command is None) == (c.url is None):
                raise ConfigError(f"mcp.servers.{i}: give exactly one of command and url")
            spec = c.url if c.url is not None else "stdio:" + shlex.join(c.command or ())
            name = c.name or parse_server_spec(spec).name
            options = c.model_dump(exclude={"name", "command", "url"})
            servers.append(McpServer(name=name, command=c.command, url=c.url, **options))
        explicit = [c.name for c in self.mcp.servers if c.name]
        if repeated := sorted({n for n in explicit if explicit.count(n) > 1}):
            raise ConfigError(f"mcp.servers: names given twice: {repeated}")
        return unique_names(servers)

    def limits(self) -> Limits:
        """The core's limits."""
        a = self.agent_stream_assemble
        return Limits(
            max_argument_bytes=a.max_tool_argument_bytes,
            max_calls_per_round=a.max_tool_calls_in_flight_assemble,
        )

    def run_limits(self) -> RunLimits:
        """The budgets of one run."""
        r = self.relay
        return RunLimits(
            max_rounds=r.max_rounds,
            max_tool_calls=r.max_tool_calls,
            deadline_s=r.deadline_s,
            call_stall_s=self.agent_stream_assemble.assemble_idle_timeout_s,
        )

    def client_limits(self) -> ClientLimits:
        """The model client's deadlines and body budget."""
        m = self.model
        return ClientLimits(
            connect_s=m.connect_s,
            first_byte_s=m.first_byte_s,
            idle_s=m.idle_s,
            max_body_bytes=m.max_body_bytes,
        )

    def retry_policy(self) -> RetryPolicy:
        """The model client's retries (the default policy with ``model.stream_retries``)."""
        return RetryPolicy(stream_retries=self.model.stream_retries)

    def preview_policy(self) -> PreviewPolicy | None:
        """The preview policy, or None when ``ui_forward_partial_args`` is off."""
        if not self.agent_stream_assemble.ui_forward_partial_args:
            return None
        p = self.previews
        return PreviewPolicy(
            default=ToolPreview(mode=p.default.mode, fields=p.default.fields),
            tools={n: ToolPreview(mode=t.mode, fields=t.fields) for n, t in p.tools.items()},
            every_bytes=p.every_bytes,
        )

    def audit_policy(self) -> AuditPolicy | None:
        """The audit of uncommitted calls (redacted as the previews are), or None when
        ``audit_uncommitted`` is off; ``ArgumentAudit(open_audit(url), policy)``."""
        g = self.ledger
        if not g.audit_uncommitted:
            return None
        return AuditPolicy(
            previews=self.preview_policy() or PreviewPolicy(),
            max_bytes=g.audit_max_bytes,
            retention_s=g.audit_retention_s,
            max_per_scope=g.audit_max_per_scope,
        )

    def stored_redactor(self) -> Redactor | None:
        """The redactor of what the ledger and its history store keep (``ledger.redact``)."""
        return redact_secrets if self.ledger.redact else None

    def result_limits(self) -> ResultLimits:
        """The size budgets of tool results."""
        return ResultLimits(max_bytes=self.results.max_bytes, tools=dict(self.results.tools))

    def dropped_codes(self) -> frozenset[ErrorCode]:
        """Error codes whose calls are dropped from history (``drop_with_protocol_repair``)."""
        a = self.agent_stream_assemble
        codes = set()
        if a.on_invalid_json == "drop_with_protocol_repair":
            # a text that is JSON but no object is invalid under arguments_must_be_object (and
            # is what Gemini, which sends arguments as objects, makes of broken text)
            codes |= {ErrorCode.INVALID_JSON, ErrorCode.ARGUMENTS_NOT_OBJECT}
        if a.on_args_overflow == "drop_with_protocol_repair":
            codes.add(ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES)
        return frozenset(codes)

    def approval_policy(self) -> ApprovalPolicy:
        """Which calls wait for a person, and for how long."""
        a = self.approvals
        return ApprovalPolicy(
            tools=a.tools, default=a.default, timeout_s=a.timeout_s, max_always=a.max_always
        )

    def agent_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`Agent` (besides client and tools)."""
        d = self.dispatcher
        return {
            "eager": d.eager,
            "eager_start": self.agent_stream_assemble.execute_before_stream_end,
            "max_tokens": self.model.max_tokens,
            "run_limits": self.run_limits(),
            "limits": self.limits(),
            "session": d.session,
            "max_concurrency": d.max_concurrency,
            "default_timeout_s": d.default_timeout_s,
            "previews": self.preview_policy(),
            "drop_failed": self.dropped_codes(),
            "result_limits": self.result_limits(),
            "approvals": self.approval_policy(),
        }

    def effective(self) -> str:
        """The effective configuration as YAML (every key, defaults included; an access
        token shows as ``[set]``)."""
        data = self.model_dump(mode="json")
        for section in ("relay", "proxy"):
            if data[section]["token"] not in (None, "auto"):
                data[section]["token"] = "[set]"
        text: str = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        return text


def load_config(path: str | Path | None = None, *, env: Mapping[str, str] | None = None) -> Config:
    """The configuration of ``path`` (None: defaults only) with the ``TOOLLATCH_...``
    overrides of ``env`` (default ``os.environ``). Raises ``ConfigError`` naming every bad
    key, its value and what was expected."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        data = _read_yaml(Path(path))
    overridden = _env_overrides(os.environ if env is None else env, data)
    return validate(data, source=source, env_keys=overridden)


def configured(
    path: str | Path | None = None, *, env: Mapping[str, str] | None = None
) -> Config | None:
    """What the commands run with: :func:`load_config` of ``path`` when there is a file or
    any ``TOOLLATCH_<SECTION>__<KEY>`` variable in ``env`` (default ``os.environ``), so that
    the environment is read with or without ``--config``; None when there are neither (the
    library's own defaults, which differ in places: eager tools start early). Raises
    ``ConfigError`` as :func:`load_config` does."""
    environ = os.environ if env is None else env
    if path is None and not any(_is_override(name) for name in environ):
        return None
    return load_config(path, env=environ)


def _is_override(name: str) -> bool:
    return name.startswith(ENV_PREFIX) and "__" in name


def validate(
    data: Mapping[str, Any], *, source: str = "config", env_keys: Mapping[str, str] | None = None
) -> Config:
    """``data`` (plain YAML values) as a :class:`Config`; raises ``ConfigError``."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        lines = [_problem(err, source, env_keys or {}) for err in exc.errors()]
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None


def _problem(err: Mapping[str, Any], source: str, env_keys: Mapping[str, str]) -> str:
    key = ".".join(str(part) for part in err["loc"])
    where = env_keys.get(key, source)
    if err["type"] == "extra_forbidden":
        return f"{key}: unknown key ({where})"
    value = err.get("input")
    shown = repr(value) if not isinstance(value, dict) else "a mapping"
    expected = str(err["msg"]).removeprefix("Input should be ")
    return f"{key}: got {shown:.80}, expected {expected} ({where})"


def _refuse_duplicates(node: Any) -> None:
    """A key given twice in one mapping is an error (PyYAML would keep the last silently)."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in seen:
                line = key_node.start_mark.line + 1
                raise ConfigError(f"key {key!r} is given twice (line {line})")
            seen.add(key)
            _refuse_duplicates(value_node)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicates(item)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    try:
        _refuse_duplicates(yaml.compose(text, Loader=yaml.SafeLoader))
        data = yaml.safe_load(text)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        told = str(exc).replace('"<unicode string>"', str(path))  # (PyYAML's name for text)
        raise ConfigError(f"{path}: not valid YAML: {' '.join(told.split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    return data


def _env_overrides(env: Mapping[str, str], data: dict[str, Any]) -> dict[str, str]:
    """Apply ``TOOLLATCH_SECTION__KEY=value`` to ``data``; returns ``{key: variable}``."""
    applied: dict[str, str] = {}
    for name in sorted(env):
        if not _is_override(name):
            continue  # other TOOLLATCH_ variables are not configuration
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"{name}: expected TOOLLATCH_<SECTION>__<KEY>")
        section, key = parts
        try:
            value = yaml.safe_load(env[name])
        except yaml.YAMLError:
            raise ConfigError(f"{name}: not a YAML value: {env[name]!r:.80}") from None
        if section not in data:
            applied[section] = name  # a section only the environment names
        target = data.setdefault(section, {})
        if not isinstance(target, dict):
            raise ConfigError(f"{name}: section {section!r} is not a mapping in the file")
        target[key] = value
        applied[f"{section}.{key}"] = name
    return applied


EXAMPLE = """\
# toollatch configuration (every key optional; the values shown are the defaults).
# Environment overrides: TOOLLATCH_<SECTION>__<KEY>=value, e.g.
#   TOOLLATCH_AGENT_STREAM_ASSEMBLE__MAX_TOOL_ARGUMENT_BYTES=65536
# Command-line flags win over the environment, the environment over this file (the
# variables are read with or without --config).

agent_stream_assemble:
  max_tool_argument_bytes: 262144       # argument text per call; more fails the call
  max_tool_calls_in_flight_assemble: 32 # calls per round; more get too_many_tool_calls
  assemble_idle_timeout_s: 60           # a call without new argument bytes this long: idle_timeout
  execute_before_stream_end: true       # eager master switch; tools still need eager=True
  ui_forward_partial_args: true         # previews of calls still streaming (see previews:)
  arguments_must_be_object: true        # the gate commits JSON objects only (true only)
  on_invalid_json: error_result         # error_result | drop_with_protocol_repair
  on_args_overflow: error_result        # error_result | drop_with_protocol_repair
  finalize_order: provider_index        # results in the provider's call order (only value)

dispatcher:
  max_concurrency: 8                    # calls running at once
  default_timeout_s: 30                 # run-time limit of a tool that sets none (null: none)
  eager: []                             # more tools that may start early (needs the switch)
  session: default                      # session lock: its rounds never run tools at once

previews:
  every_bytes: 256                      # throttle: an update every this many argument bytes
  default:
    mode: none                          # none (name and bytes) | fields | full
    fields: []                          # JSON pointers shown in fields mode
  tools: {}                             # per tool: write_file: {mode: fields, fields: [/path]}

model:
  provider: openai_chat                 # openai_chat | openai_responses | anthropic | gemini
                                        # | bedrock (run only)
  model: null                           # required with base_url
  base_url: null                        # null: the embedded scripted server (toollatch run)
  api_key_env: null                     # variable holding the key (null: the provider's usual)
  max_tokens: null
  connect_s: 10
  first_byte_s: 120
  idle_s: 120                           # longest silence between two chunks
  max_body_bytes: 67108864              # body bytes per response, decoded (64 MiB; a gzip
                                        # bomb stops here): stream_interrupted beyond
  stream_retries: 2                     # broken streams asked again in a row (0: never)

relay:
  host: 127.0.0.1                       # beyond loopback (0.0.0.0) needs a token
  port: 8000
  max_rounds: 8                         # run limits (toollatch run uses them too)
  max_tool_calls: 64
  deadline_s: 900                       # wall-clock limit of a run (null: none); at it the
                                        # round in flight is cancelled, every call paired
  token: null                           # access token (auto: make one); better in the env:
                                        # TOOLLATCH_RELAY__TOKEN
  allowed_hosts: []                     # Host names besides loopback's (*.example.com, *)
  allowed_origins: []                   # origins a POST may come from besides the relay's
  models: null                          # models the browser may pick (null: model.model)
  max_active_runs: 16                   # runs in flight over all sessions (429 beyond)
  max_stored_runs: 256                  # runs kept for resume (at least max_active_runs)
  max_run_events: 20000                 # events stored per run: the run is cancelled at
                                        # it (only events pairing calls kept past it)
  max_kept_bytes: 1048576               # SSE bytes kept per run (older: event: lagged)
  max_body_bytes: 65536                 # largest request body (413 beyond)
  max_message_chars: 16000              # longest user message (422 beyond)
  heartbeat_s: 15                       # an SSE comment after this long without events
  sse_batch: 64                         # stored events written per send at most
  max_session_runs: 4                   # runs in flight per session (429 beyond)
  max_session_readers: 8                # event streams open per session (429 beyond)
  max_connections: 1000                 # open connections (kept under ulimit -n)
  max_header_bytes: 65536               # request line + headers (431 beyond)
  header_timeout_s: 10                  # a request head must arrive within (408)
  idle_timeout_s: 15                    # an idle keep-alive connection is closed after
  body_timeout_s: 30                    # a request body must arrive within (408)
  shutdown_grace_s: 10                  # SIGTERM/SIGINT: wait this long for the cancelled
                                        # runs to end (streams get run_ended), then exit
  max_chat_messages: 400                # history entries a chat keeps (409 beyond)
  max_chat_body_bytes: 1048576          # largest POST /api/chat body (413 beyond)
  max_ui_bytes: 65536                   # largest tool UI payload sent to the browser (left
                                        # out beyond: ui_omitted)
  result_text: summary                  # a result's text preview to the browser: summary
                                        # (no UI payload or failed) | always | never
  approval_secret_env: null             # env variable with the key of approval tokens
                                        # (null: random per process)
  store: "memory:"                      # runs: memory: (this process) | redis://HOST:PORT/DB
                                        # (shared: any worker serves any run)
  store_ttl_s: 3600                     # a shared store keeps an ended run this long
  store_outage_s: 5                     # retry an unreachable store this long, then
                                        # cancel this worker's runs
  lease_s: 10                           # a worker silent this long is dead: another
                                        # ends its runs (every call paired)
  durable: null                         # postgresql://USER@HOST:PORT/DB: runs are DBOS
                                        # workflows a survivor finishes (needs redis store)

proxy:                                  # toollatch proxy (its flags win over these)
  upstream: null                        # the model server's base URL, http://HOST:PORT/v1
  upstream_key_env: TOOLLATCH_PROXY_UPSTREAM_KEY  # variable holding the upstream's key
  upstream_provider: openai_chat        # the upstream's wire: openai_chat (forwarded as is) |
                                        # anthropic | gemini | openai_responses | bedrock
                                        # (translated)
  host: 127.0.0.1                       # beyond loopback needs a token
  port: 8080
  calls: hold                           # hold: calls sent once committed, whole | stream:
                                        # argument text live, verdicts at the end
  token: null                           # clients' token (auto: make one); better in the env:
                                        # TOOLLATCH_PROXY__TOKEN
  allowed_hosts: []                     # Host names besides loopback's and the bound one
  record: null                          # folder: each upstream answer saved as a fixture
  idle_timeout_s: 60                    # upstream silence mid-stream: the round fails
  max_request_bytes: 16777216           # a request body's bound (413 beyond)
  max_connections: 1000                 # open client connections
  max_header_bytes: 65536               # request line + headers (431 beyond)
  header_timeout_s: 10                  # a request head must arrive within (408)
  keepalive_timeout_s: 15               # an idle keep-alive connection is closed after
  body_timeout_s: 30                    # a request body must arrive within (408)

ledger:
  url: null                             # sqlite:///PATH | redis://HOST:PORT/DB | none (null:
                                        # none for run; serve: sqlite in ~/.local/share/toollatch)
  lease_s: 30                           # a claim lives this long unrenewed (a dead run's
                                        # call is taken over by --resume after it)
  audit_uncommitted: false              # record calls that failed the gate or were cut off
  audit_max_bytes: 512                  # redacted (by the previews rules) argument text kept
  audit_retention_s: 86400              # seconds a record is kept
  audit_max_per_scope: 1000             # newest records kept per run
  redact: false                         # store history and results through the redactor
results:
  max_bytes: 65536                      # a tool result's budget in UTF-8 bytes (>= 256); cut beyond
  tools: {}                             # per tool: read_file: 262144 (over @tool(max_result_bytes))

logging:
  format: text                          # text | json (no argument values either way)
  level: INFO

mcp:
  servers: []                           # MCP servers whose tools the agent may call, e.g.
  # - name: notes                       #   prefix of its tool names on a collision
  #   command: [python, -m, toollatch.mcp.example_server]   # stdio; or url: http://HOST/mcp
  #   env: {}                           #   variables for a stdio server (e.g. its own key)
  #   inherit_env: false                #   false: PATH, HOME, locale... + env; true: all of ours
  #   eager: []                         #   its tools that may start early (patterns)
  #   timeout_s: 30                     #   run-time limit of one call
  #   max_concurrency: 4                #   its calls running at once
  #   allow: null                       #   patterns the gate lets through (null: all)
  #   deny: []                          #   patterns the gate refuses
  #   max_schema_bytes: 65536           #   a tool whose inputSchema is larger is left out
  #   max_schema_depth: 32              #   ... or nested deeper
  #   max_description_chars: 4096       #   a longer description is cut

approvals:
  tools: []                             # tools whose calls wait for a person (MCP tools too)
  default: run                          # run | ask: every other tool's calls wait too
  timeout_s: 300                        # an unanswered call fails approval_expired (null: never)
  max_always: 32                        # tools one session may "always allow" (kept in the ledger)
"""
"""What ``toollatch config example`` prints: every key, commented, at its default."""
