"""The plan records every layer shares: what placement plans for one worker (``ReplicaSpec``),
per deployment (``DeploymentPlan``), for Router mode (``RouterPlan``, ``AuthzOptions``) and for
the whole service (``ServicePlan``), and the one vocabulary of replica states
(``ReplicaState``).

Config and placement build these; the supervisor, the pool and the frontend read them. Pure
data: at runtime this module imports nothing of the package (config's and the pool's types are
named for the type checker only), so any layer can import it without pulling in another, and
no import runs back up.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_sr.jsontypes import JsonObject

if TYPE_CHECKING:
    from vllm_sr.config.routing import Routing
    from vllm_sr.config.routing_providers import Providers
    from vllm_sr.config.schema import GlobalSection
    from vllm_sr.pool.settings import PoolSettings


class ReplicaState(enum.StrEnum):
    """One replica's lifecycle state. The supervisor's handle on a worker
    (``ManagedReplica.state``) and the pool's record (``Replica.state``) use this one
    vocabulary, each written by its one owner (docs/internals.md, "Replica state")."""

    STARTING = "starting"  # spawned, waiting for /health 200
    READY = "ready"  # healthy and a member of dispatch
    HUNG = "hung"  # its forward ran past the hang bound: out of dispatch, being restarted
    BACKOFF = "backoff"  # process exited; waiting to be restarted
    EJECTED = "ejected"  # shown for a READY replica the outlier detector took out
    DRAINING = "draining"  # finishing what it has, admits nothing new
    INCOMPATIBLE = "incompatible"  # reported limits differ from the configured ones
    FAILED = "failed"  # will not be restarted (bad artifact, golden check ...)
    STOPPED = "stopped"  # no process


@dataclass(frozen=True)
class ReplicaSpec:
    """What the supervisor needs to start (or attach) one worker."""

    id: str
    deployment: str
    index: int
    artifact: str
    revision: str | None
    device: str | None
    endpoint: str | None = None
    model: str | None = None
    threads: int | None = None
    cpus: tuple[int, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    dtype: str = "auto"
    max_input_tokens: int | None = None
    """input.max_tokens: most tokens of one input (None: the model's maximum)."""
    overflow: str = "reject"
    """input.overflow: reject or truncate (the worker's default for an over-long input)."""
    public_name: str | None = None
    """Another name requests may use in ``model`` (the worker accepts it too)."""
    host_device: str | None = None
    """The GPU as the inventory tool lists it (``rocm:3``) when ``device`` is an allocation
    ordinal (``rocm:0``); else equal to ``device``. The key of ``gpus.gpu_usage``."""

    @property
    def attached(self) -> bool:
        return self.endpoint is not None

    @property
    def torch_device(self) -> str | None:
        """The device inside the worker: its env shows it exactly one GPU, so always index 0."""
        if self.device is None:
            return None
        return "cpu" if self.device == "cpu" else "cuda:0"

    def identity(self) -> tuple[object, ...]:
        """A reload keeps a running worker only when this tuple is unchanged."""
        return (
            self.artifact,
            self.revision,
            self.max_num_seqs,
            self.max_num_batched_tokens,
            self.dtype,
            self.max_input_tokens,
            self.overflow,
            self.public_name,
            self.device if not self.attached else (self.endpoint, self.model),
            self.threads,
        )

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "deployment": self.deployment,
            "device": self.device if not self.attached else None,
            **({"host_device": self.host_device} if self.host_device else {}),
            **({"endpoint": self.endpoint, "model": self.model} if self.attached else {}),
            "threads": self.threads,
            "cpus": list(self.cpus) if self.cpus is not None else None,
            "env": dict(self.env),
        }


@dataclass
class DeploymentPlan:
    name: str
    artifact: str
    replicas: list[ReplicaSpec]
    # The deployment's one settings object (deadline, ejection, limits set in config),
    # built once from the schema (``PoolSettings.from_deployment``). Required: a default would
    # make this neutral module reach up into the pool.
    settings: PoolSettings
    public_name: str | None = None
    """v0.4's public_name: another name requests may use in ``model``."""


@dataclass(frozen=True)
class AuthzOptions:
    """``global.services.authz``: where the caller's identity is read, and whether a request
    without one may pass when role bindings are configured."""

    user_id_header: str = "x-authz-user-id"
    user_groups_header: str = "x-authz-user-groups"
    fail_open: bool = False


@dataclass(frozen=True)
class RouterPlan:
    """Router mode's settings of one generation (config.yaml's providers, routing, recipes and
    auto model names); the frontend's chat mount builds its router from it."""

    enabled: bool
    auto_model_names: tuple[str, ...]
    providers: Providers | None
    routing: Routing | None
    decision_deployment: str
    authz: AuthzOptions = field(default_factory=AuthzOptions)
    recipes: Mapping[str, Routing] = field(default_factory=dict)  # by name, "default" included
    entrypoints: Mapping[str, str] = field(default_factory=dict)  # model name -> recipe
    global_: GlobalSection | None = None
    # SHA-256 of the config.yaml text this plan came from (the inventory's served_hash once
    # published); None for a plan built without a file
    config_hash: str | None = None


@dataclass
class ServicePlan:
    """The supervisor's view of a planned service: per deployment its settings and replica
    specs, Router mode's settings, and what serve needs of config.yaml."""

    deployments: dict[str, DeploymentPlan]
    default_deployment: str
    config: JsonObject = field(default_factory=dict)  # the effective config, for /v1/config
    router: RouterPlan | None = None  # None: Engine mode (and plans tests build by hand)
    listen: str | None = None  # HOST:PORT of config.yaml's first listener (serve's default)
    embedded_default: str | None = None  # the built-in artifact served when no model_catalog

    def specs(self) -> list[ReplicaSpec]:
        return [spec for d in self.deployments.values() for spec in d.replicas]
