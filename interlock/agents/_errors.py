"""What an agent node raises. The engine turns each into the node's error, named by the
class (and its bases), so a node's ``retry: {errors: [...]}`` can list these names:

    AgentError
    ├── AgentOutputError      the reply never satisfied the output schema (after one repair)
    ├── AgentTurnsError       max_turns model calls without a final answer
    ├── AgentConfigError      a scripted provider out of replies, a bad template, an MCP
    │   │                     server without a tool named: the definition (fix, migrate)
    │   └── AgentEnvironmentError  no API key, an MCP header's ${VAR} unset, no extra:
    │                         this process's environment (set it, resume)
    ├── ToolDefinitionError   a tool's signature cannot be offered to a model
    ├── ToolUnavailable       an MCP server cannot be reached (after one reconnection)
    └── ProviderError         the provider call failed
        ├── RateLimitError            HTTP 429
        ├── ProviderServerError       HTTP 5xx
        ├── ProviderTimeoutError      the HTTP request timed out
        ├── ProviderConnectionError   no connection (also a ConnectionError)
        └── ProviderStatusError       any other refusal (4xx): retrying will not help

``retry: {attempts: 3, errors: [RateLimitError, ProviderServerError]}`` retries
throttling and server errors; ``errors: [ProviderError]`` every provider failure.
"""

from __future__ import annotations

from .._errors import AgentError as AgentError  # the base, with every other error


class AgentOutputError(AgentError):
    """The model's reply did not satisfy the output schema, even after a repair round."""


class AgentTurnsError(AgentError):
    """The model used up ``max_turns`` calls without a final answer."""


class AgentConfigError(AgentError):
    """The agent cannot run as configured (missing key, no scripted reply left, ...)."""


class AgentEnvironmentError(AgentConfigError):
    """The agent cannot run in this process's environment -- an API key or an MCP
    header's variable not set, an extra not installed -- while its definition is sound:
    set what it names and resume (a plain `AgentConfigError` comes from the definition
    the run keeps: a resume fails the same way until the run is migrated)."""


class ToolDefinitionError(AgentError):
    """A tool function cannot be described to a model (an untyped parameter, ``*args``)."""


class ToolUnavailable(AgentError, ConnectionError):
    """A tool's MCP server cannot be reached, or its connection failed twice: the node
    fails (whatever ``tool_errors`` says), naming the server and the cause."""


class ProviderError(AgentError):
    """A call to the model provider failed."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RateLimitError(ProviderError):
    """The provider throttled the call (HTTP 429)."""


class ProviderServerError(ProviderError):
    """The provider failed (HTTP 5xx)."""


class ProviderTimeoutError(ProviderError):
    """The provider did not answer in time."""


class ProviderConnectionError(ProviderError, ConnectionError):
    """The provider could not be reached."""


class ProviderStatusError(ProviderError):
    """The provider refused the request (a 4xx other than 429)."""
