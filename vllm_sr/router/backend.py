"""One LLM backend: a ``providers.models[].backend_refs`` entry of one model, with the name
that backend expects for the model, its credential, its health and its request statistics.
:mod:`vllm_sr.router.backends` spreads chats over them and runs their health checks;
:mod:`vllm_sr.router.backend_proxy` sends one chat to one of them.

- Health: ``GET {api}/models`` (or ``reliability.health_check_path`` on the backend's
  server) every ``HEALTH_EVERY_S`` (``health_check_interval``) while healthy, within
  ``HEALTH_TIMEOUT_S`` (``health_check_timeout``); after a failure (a failed check, or a
  proxied request that could not reach the server) the backend is unhealthy and re-checked
  after a doubling backoff (0.5 s to 30 s), as the pool does for replicas: the cluster's
  :class:`~vllm_sr.cluster.health.HealthProbe` on a clock, with these settings.
- Credential (upstream's rules): the key is ``api_key``, else the environment variable
  ``api_key_env`` (read once, when the backend is built, and never logged: only the variable's
  name is, when it is unset). It goes as ``<auth_header>: <auth_prefix> <key>``; the header and
  prefix default by ``provider`` (openai and unset: ``Authorization: Bearer``), and an empty
  ``auth_prefix`` counts as unset, as upstream. With no key, the caller's own value of that
  header is passed on (upstream's Envoy keeps the caller's header), so a client may bring its
  own key.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from vllm_sr.clock import Clock
from vllm_sr.cluster.health import HealthProbe
from vllm_sr.config.routing_providers import BackendRef, ProviderModel, seconds_or
from vllm_sr.jsontypes import JsonObject
from vllm_sr.pool.stats import LatencyWindow, RateWindow

log = logging.getLogger("vllm_sr.router.backends")

HEALTH_EVERY_S = 5.0
HEALTH_TIMEOUT_S = 3.0
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0


def health_probe(clock: Clock, every_s: float = HEALTH_EVERY_S) -> HealthProbe:
    """A backend's health: ``unknown`` until the first check (requests may go there),
    ``healthy`` (re-checked every ``every_s``), ``unhealthy`` (re-checked after a doubling
    backoff, 0.5 s to 30 s)."""
    return HealthProbe(
        clock, backoff_s=BACKOFF_INITIAL_S, backoff_max_s=BACKOFF_MAX_S, every_s=every_s
    )


# provider -> (auth header, auth prefix): upstream's providerTypeRegistry.
PROVIDER_AUTH: dict[str, tuple[str, str]] = {
    "openai": ("Authorization", "Bearer"),
    "anthropic": ("x-api-key", ""),
    "azure-openai": ("api-key", ""),
    "bedrock": ("Authorization", "Bearer"),
    "gemini": ("Authorization", "Bearer"),
    "vertex-ai": ("Authorization", "Bearer"),
    "minimax": ("Authorization", "Bearer"),
}
DEFAULT_AUTH = PROVIDER_AUTH["openai"]


def credential_header(ref: BackendRef) -> tuple[str, str]:
    """(header, prefix) for ``ref``'s key: the provider's defaults, overridden by
    ``auth_header`` / a non-empty ``auth_prefix``."""
    header, prefix = PROVIDER_AUTH.get(ref.provider or "", DEFAULT_AUTH)
    return ref.auth_header or header, ref.auth_prefix or prefix


def pricing_of(model: ProviderModel) -> JsonObject | None:
    """The model's prices as reported (currency USD unless given), or None when it has none
    (upstream's rule: any price, or a currency alone)."""
    if model.pricing is None or not model.pricing.configured:
        return None
    doc = model.pricing.model_dump(exclude_none=True)
    doc["currency"] = model.pricing.currency or "USD"
    return doc


class Backend:
    """One backend ref of one model, with its health and request statistics."""

    def __init__(self, model: ProviderModel, ref: BackendRef, index: int, clock: Clock) -> None:
        self.model = model.name
        self.ref = ref
        self.index = index  # in the model's backend_refs (its outlier detector's index)
        self.id = ref.endpoint_name(model.name, index)  # upstream's endpoint id <model>_<name>
        self.name = self.id[len(model.name) + 1 :]
        self.model_id = model.model_id_for(ref)  # what the backend calls the model
        self.weight = ref.effective_weight
        self.api_base = ref.api_base()
        self.api_key_env = ref.api_key_env
        self.auth_header, self.auth_prefix = credential_header(ref)
        self._key = ref.api_key or (os.environ.get(ref.api_key_env) if ref.api_key_env else None)
        if ref.api_key_env and not self._key:
            log.warning(
                "backend %s of model %s: environment variable %s is unset; requests carry "
                "only the caller's own %s header",
                self.api_base,
                model.name,
                ref.api_key_env,
                self.auth_header,
            )
        rel = model.reliability
        every_s = (
            HEALTH_EVERY_S if rel is None else seconds_or(rel.health_check_interval, HEALTH_EVERY_S)
        )
        self.health = health_probe(clock, every_s)
        self.health_timeout_s = (
            HEALTH_TIMEOUT_S
            if rel is None
            else seconds_or(rel.health_check_timeout, HEALTH_TIMEOUT_S)
        )
        self.health_path = None if rel is None else rel.health_check_path
        # With ejection on (consecutive_5xx), a 5xx answer counts toward it instead of marking
        # the backend unhealthy at once (Envoy: outlier detection is passive, health active).
        self.ejects_on_5xx = bool(rel and rel.consecutive_5xx and len(model.backend_refs) > 1)
        self.latency = LatencyWindow(1024)
        self.rate = RateWindow(clock)
        self.requests = 0
        self.errors = 0
        self.inflight = 0
        self.retried_from = 0  # chats retried on another backend after failing here
        self.rr_current = 0  # the smooth weighted round robin's running score

    def headers(self, caller: Mapping[str, str] | None = None) -> dict[str, str]:
        """The request headers: the configured credential, else the caller's own value of
        the credential header (``caller`` has lower-case names, as httpserver reads them)."""
        out = {"Content-Type": "application/json"}
        if self._key:
            out[self.auth_header] = (
                f"{self.auth_prefix} {self._key}" if self.auth_prefix else self._key
            )
        elif caller is not None and caller.get(self.auth_header.lower()):
            out[self.auth_header] = caller[self.auth_header.lower()]
        return out

    def record(self, seconds: float, ok: bool) -> None:
        self.requests += 1
        self.rate.add()
        self.latency.add(seconds)
        if not ok:
            self.errors += 1

    def record_cancelled(self) -> None:
        """A chat we cancelled before it ended (a looper's round at its quorum, a caller
        gone): a request, not an error, and its cut-short time is not the backend's latency."""
        self.requests += 1
        self.rate.add()

    def inventory(self) -> JsonObject:
        p50, p99 = self.latency.percentiles(0.5, 0.99)
        return {
            "model": self.model,
            "name": self.name,
            "id": self.id,
            "provider_model_id": self.model_id,
            "url": self.api_base,
            "weight": self.weight,
            "type": self.ref.endpoint_type,
            "provider": self.ref.provider,
            "state": self.health.state,
            "inflight": self.inflight,
            "requests": self.requests,
            "requests_per_s": round(self.rate.rate(), 3),
            "latency_p50_ms": None if p50 is None else round(p50 * 1000, 3),
            "latency_p99_ms": None if p99 is None else round(p99 * 1000, 3),
            "errors": self.errors,
            "retried_from": self.retried_from,
            "health_failures": self.health.failures,
            "last_error": self.health.last_error,
        }
