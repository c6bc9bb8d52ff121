"""The ``shadow_dispatch`` decision plugin's model (upstream's ``shadow_dispatch`` in
``C/plugin_config.go``; its credential headers from upstream's CLI ``models.py``), with
upstream's names and defaults: a bounded, sampled copy of the request to a secondary model,
never carrying a caller's credential. The copies: vllm_sr/router/plugins/shadow.py."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from vllm_sr.config.routing_base import Strict

# Headers that carry a caller's credential: a shadow copy never carries them (upstream's
# SHADOW_CREDENTIAL_HEADERS in its CLI's models.py, kept in step with its router).
SHADOW_CREDENTIAL_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "x-user-openai-key",
        "x-user-anthropic-key",
        "x-user-azure-openai-key",
        "x-user-bedrock-key",
        "x-user-gemini-key",
        "x-user-vertex-ai-key",
        "x-user-minimax-key",
    }
)


class ShadowDispatchPlugin(Strict):
    """Upstream's ``shadow_dispatch``: a bounded, sampled asynchronous copy of the request to
    a secondary model after the primary dispatch; the caller's answer never waits for it
    and never changes because of it (vllm_sr/router/plugins/shadow.py)."""

    enabled: bool
    """Required (upstream: an omitted flag must not read as on)."""

    model: str | None = None
    """The providers.models name the copy goes to (required when enabled)."""

    sample_rate: float | None = Field(default=None, ge=0, le=1)
    """Share of the decision's chats copied (unset: every one)."""

    max_concurrency: int = Field(default=2, ge=0)
    """Copies in flight at once for this decision (0: the default, 2)."""

    max_queue_depth: int = Field(default=8, ge=0)
    """Copies waiting for a slot; a copy beyond it is dropped and counted (0: the default,
    8)."""

    timeout_seconds: int = Field(default=30, ge=0)
    """One copy's time limit, retries included (0: the default, 30)."""

    max_response_bytes: int = Field(default=1048576, ge=0)
    """The secondary's answer is read up to this many bytes (0: the default, 1 MiB); a longer
    one counts as ``too_large``."""

    max_retries: int = Field(default=0, ge=0, le=3)
    """Further tries after a connection failure or a 5xx."""

    capture_response_body: bool = False
    """Upstream: keep the secondary's answer in its replay record. vllm-sr keeps none
    (metadata; the outcome is counted)."""

    max_capture_bytes: int = Field(default=4096, ge=0)
    """Upstream: the captured answer's size (metadata, as capture_response_body)."""

    tls_skip_verify: bool = False
    """Refused when true: vllm-sr always verifies a backend's TLS."""

    forward_headers: list[str] = Field(default_factory=list)
    """Names set by the decision's header_mutation that the copy carries too; nothing else
    the decision sets for the primary is forwarded. Credential headers are refused."""

    @field_validator("forward_headers")
    @classmethod
    def _no_credentials(cls, names: list[str]) -> list[str]:
        for name in names:
            bare = name.strip()
            if not bare or bare.startswith(":"):
                raise ValueError(
                    f"forward_headers entry {name!r}; accepted: a header name (not empty, not "
                    "a pseudo-header)"
                )
            if bare.lower() in SHADOW_CREDENTIAL_HEADERS:
                raise ValueError(
                    f"forward_headers entry {name!r} is a credential header; accepted: header "
                    "names other than " + ", ".join(sorted(SHADOW_CREDENTIAL_HEADERS))
                )
        return names

    @model_validator(mode="after")
    def _model_when_enabled(self) -> ShadowDispatchPlugin:
        if self.enabled and not (self.model or "").strip():
            raise ValueError("shadow_dispatch: model is required when enabled is true")
        return self
