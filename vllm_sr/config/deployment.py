"""pydantic models of one deployment under ``global.model_catalog.deployments``: its replicas
(managed on a device, or attached at an endpoint), the engine arguments they share, and the
outlier detection that ejects replicas that keep timing out; with the device and endpoint
grammars and the limits and defaults those fields use.

``schema`` assembles these into the whole file (and re-exports them, so ``schema`` stays the
one import for callers); the cross-field rules of a deployment (the product page's "What
replicas share") live in ``file_rules`` with every other rule.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from vllm_sr.config.problems import REFUSED_VALUE, SEMANTIC_ERROR
from vllm_sr.config.routing_base import Strict
from vllm_sr.endpoint import ENDPOINT_ACCEPTED, endpoint_problem

DEVICE_RE = re.compile(r"^(auto|cpu|rocm:(0|[1-9][0-9]{0,3})|cuda:(0|[1-9][0-9]{0,3}))$")
DEVICE_ACCEPTED = "auto, cpu, rocm:N or cuda:N (N a GPU index, e.g. rocm:0)"
AUTO_DEVICE = "auto"  # the planner picks a GPU when the inventory lists one, else cpu
MAX_INPUT_TOKENS = 1_048_576
PROFILE_REASON = (
    "vllm-sr's workers have one engine path (dynamic batching under calibrated limits; the "
    "precision is engine_args.dtype), so upstream's runtime profiles (exact, batching, "
    "max_speed, plugin profiles) select nothing here; accepted: omit profile"
)
WINDOW_REASON = (
    "a sliding window pooled over an over-long input is not built in vllm-sr's workers; "
    "accepted: reject (a 400 naming the limit) or truncate (cut to max_tokens)"
)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
NAME_ACCEPTED = "1-63 characters: letters, digits, '_', '.', '-', starting with a letter or digit"
MAX_REPLICAS = 64
MAX_THREADS = 1024
MAX_EJECTION_MS_LIMIT = 3_600_000
DEFAULT_TIMEOUT_MS = 30_000
# Outlier detection defaults: their one home (the pool's settings read them, through schema).
DEFAULT_CONSECUTIVE_TIMEOUTS = 3
DEFAULT_BASE_EJECTION_MS = 30_000
DEFAULT_MAX_EJECTION_PERCENT = 50
DEFAULT_ARTIFACT = "vllm-sr/d3-edge"

# The bounds of a deployment's pool settings: their one owner. The config models below and the
# pool's ``PoolSettings`` (built from them) both declare their fields with these types.
TimeoutMs = Annotated[int, Field(ge=1, le=3_600_000)]
HangAfterMs = Annotated[int, Field(ge=1000, le=86_400_000)]
ConsecutiveTimeouts = Annotated[int, Field(ge=0, le=1000)]
EjectionMs = Annotated[int, Field(ge=1, le=MAX_EJECTION_MS_LIMIT)]
EjectionPercent = Annotated[int, Field(ge=0, le=100)]
MaxNumSeqs = Annotated[int, Field(ge=1, le=65536)]
MaxNumBatchedTokens = Annotated[int, Field(ge=1, le=16_777_216)]


Platform = Literal["cpu", "rocm", "cuda"]


def device_platform(device: str) -> str:
    """``rocm:1`` -> ``rocm``; ``cpu`` -> ``cpu``."""
    return device.split(":", 1)[0]


def device_index(device: str) -> int | None:
    """``rocm:1`` -> 1; ``cpu`` -> None."""
    _, _, idx = device.partition(":")
    return int(idx) if idx else None


def _check_device(v: str) -> str:
    if not DEVICE_RE.match(v):
        raise PydanticCustomError(
            "device_grammar",
            "'{value}' is not a device; accepted: " + DEVICE_ACCEPTED,
            {"value": v},
        )
    return v


def _check_endpoint(v: str) -> str:
    reason = endpoint_problem(v)
    if reason is not None:
        raise PydanticCustomError(
            "endpoint_grammar",
            "'{value}' is not an endpoint: {reason}; accepted: " + ENDPOINT_ACCEPTED,
            {"value": v, "reason": reason},
        )
    return v


DeviceStr = Annotated[str, AfterValidator(_check_device)]
EndpointStr = Annotated[str, AfterValidator(_check_endpoint)]


def default_max_ejection_ms(base_ejection_ms: int) -> int:
    """max_ejection_ms left unset: ten times the base, at most an hour."""
    return min(10 * base_ejection_ms, MAX_EJECTION_MS_LIMIT)


def ejection_bounds_problem(base_ejection_ms: int, max_ejection_ms: int | None) -> str | None:
    """The one cross-field check of outlier_detection: max may not be below base."""
    if max_ejection_ms is not None and max_ejection_ms < base_ejection_ms:
        return (
            f"max_ejection_ms {max_ejection_ms} is below base_ejection_ms {base_ejection_ms}; "
            f"accepted: a value >= base_ejection_ms (and at most {MAX_EJECTION_MS_LIMIT})"
        )
    return None


PRECISION_DTYPE: dict[str, Literal["float32", "bfloat16", "float16"]] = {
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
}


class EngineArgs(Strict):
    max_num_seqs: MaxNumSeqs | None = None
    """Most rows one forward batches together. Unset: the worker's default. Set it to give
    every replica the same limit; a replica reporting another value is kept out of dispatch."""

    max_num_batched_tokens: MaxNumBatchedTokens | None = None
    """Most tokens one forward batches together. Unset: each worker calibrates its own budget at
    startup, so replicas may report different values."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Precision of the forward. auto (default): on a GPU bfloat16 where the device has it,
    else float16; on a CPU bfloat16 when it has native bf16 (AMX or AVX512-BF16), else
    float32. An explicit value is honoured (a slow one is warned about). Every replica reports
    the dtype it resolved; one that differs from its peers is kept out of dispatch."""


class InputPolicy(Strict):
    """v0.4's ``input``: how long one input may be, and what an over-long one gets."""

    max_tokens: int | None = Field(default=None, ge=1, le=MAX_INPUT_TOKENS)
    """Most tokens of one input (special tokens included). Unset: the model's own maximum. A
    value above the model's maximum is capped at it by the worker."""

    overflow: str = "reject"
    """reject (default): an over-long input is answered 400 max_length_exceeded naming the
    limit, unless the request itself sends "truncate": true; truncate: cut to the limit
    (keeping the closing special token). window (upstream's pooled sliding window) is refused."""

    @field_validator("overflow")
    @classmethod
    def _check_overflow(cls, v: str) -> str:
        if v == "window":
            raise PydanticCustomError(
                REFUSED_VALUE, "overflow 'window' is refused: " + WINDOW_REASON
            )
        if v not in ("reject", "truncate"):
            raise PydanticCustomError(
                REFUSED_VALUE,
                "overflow '{value}' is not a policy; accepted: reject or truncate",
                {"value": v},
            )
        return v


class OutlierDetection(Strict):
    consecutive_timeouts: ConsecutiveTimeouts = DEFAULT_CONSECUTIVE_TIMEOUTS
    """Exchanges in a row that run past their deadline before a replica is ejected; 0 = off."""

    base_ejection_ms: EjectionMs = DEFAULT_BASE_EJECTION_MS
    """First ejection's length in ms; each repeat doubles it up to max_ejection_ms."""

    max_ejection_ms: EjectionMs | None = None
    """Longest ejection in ms. Default: ten times base_ejection_ms, at most 3600000 (an hour).
    Must not be below base_ejection_ms."""

    max_ejection_percent: EjectionPercent = DEFAULT_MAX_EJECTION_PERCENT
    """Most replicas (percent) out at once; one may always be out."""

    @model_validator(mode="after")
    def _fill_max(self) -> OutlierDetection:
        problem = ejection_bounds_problem(self.base_ejection_ms, self.max_ejection_ms)
        if problem is not None:
            raise PydanticCustomError(SEMANTIC_ERROR, problem)
        if self.max_ejection_ms is None:
            self.max_ejection_ms = default_max_ejection_ms(self.base_ejection_ms)
        return self


class Replica(Strict):
    device: DeviceStr | None = None
    """Managed worker placement: auto, cpu, rocm:N or cuda:N. auto: the planner picks a GPU
    the inventory lists (CUDA first, then ROCm), else cpu. N is a host GPU index, or, when the
    process was given GPUs (a *_VISIBLE_DEVICES variable set, or a Kubernetes pod), an
    allocation ordinal into them."""

    endpoint: EndpointStr | None = None
    """Attached runtime URL (http://HOST:PORT or unix:/path); the runtime manages itself."""

    model: str | None = None
    """Served model name of an attached replica (required with endpoint)."""

    @property
    def attached(self) -> bool:
        return self.endpoint is not None


class Deployment(Strict):
    provider: str = "model_runtime"
    """Who runs the workers; only model_runtime (vllm-sr's own workers) exists. Upstream's
    other providers (candle: its in-router engine; http: an external classifier) are refused
    by name."""

    @field_validator("provider")
    @classmethod
    def _only_model_runtime(cls, v: str) -> str:
        if v != "model_runtime":
            raise PydanticCustomError(
                REFUSED_VALUE,
                "provider '{value}' is refused: vllm-sr runs every deployment as its own "
                "model_runtime workers (transformers on the deployment's device; an fp32 "
                "precision is engine_args.dtype float32); accepted: 'model_runtime'",
                {"value": v},
            )
        return v

    artifact: str = Field(default=DEFAULT_ARTIFACT, min_length=1, max_length=512)
    """Model artifact: a built-in name such as vllm-sr/d3-edge, vllm-sr/NAME for a model
    installed under the artifacts directory (host setting artifacts_dir), or a local directory."""

    revision: str | None = Field(default=None, max_length=128)
    """Artifact revision; every replica uses the same one. Each worker is told it, reports the
    revision it serves (a note when the asked one does not name that content), and a replica
    whose revision differs from its peers' is kept out of dispatch (pool compat)."""

    profile: str | None = None
    """Upstream v0.4's runtime profile: refused when set (see PROFILE_REASON)."""

    input: InputPolicy = Field(default_factory=InputPolicy)
    """v0.4's input length policy (see InputPolicy)."""

    public_name: str | None = Field(default=None, min_length=1, max_length=256)
    """Another name clients may use in a request's ``model`` for this deployment (v0.4's native
    API name); unique across deployments and not another deployment's name."""

    precision: Literal["auto", "fp32", "fp16", "bf16"] | None = None
    """v0.4's name for the forward's precision: fp32, fp16, bf16 set ``engine_args.dtype``
    (float32, float16, bfloat16; auto: auto). Refused when engine_args.dtype says otherwise."""

    compilation_cache_dir: str | None = Field(default=None, max_length=4096)
    """v0.4: upstream's runtime compile cache (deployment: vllm-sr's workers run eager)."""

    custom_ops_profile: str | None = Field(default=None, max_length=256)
    """v0.4: upstream's runtime custom-op set (deployment: no effect here)."""

    external_model: str | None = None
    """v0.4: an external classifier behind a provider: http deployment; refused (every
    vllm-sr deployment is its own model_runtime workers)."""

    @field_validator("external_model")
    @classmethod
    def _refuse_external(cls, v: str | None) -> str | None:
        if v is not None:
            raise PydanticCustomError(
                REFUSED_VALUE,
                "external_model '{value}' is refused: a deployment here is vllm-sr's own "
                "model_runtime workers; accepted: artifact (and replicas or endpoint)",
                {"value": v},
            )
        return v

    @model_validator(mode="after")
    def _precision_is_dtype(self) -> Deployment:
        if self.precision is None or self.precision == "auto":
            return self
        dtype = PRECISION_DTYPE[self.precision]
        if "dtype" in self.engine_args.model_fields_set and self.engine_args.dtype != dtype:
            raise PydanticCustomError(
                REFUSED_VALUE,
                "precision '{p}' and engine_args.dtype '{d}' disagree; accepted: one of them, "
                "or the same precision ({dtype})",
                {"p": self.precision, "d": self.engine_args.dtype, "dtype": dtype},
            )
        self.engine_args.dtype = dtype
        return self

    @field_validator("profile")
    @classmethod
    def _refuse_profile(cls, v: str | None) -> str | None:
        if v is not None:
            raise PydanticCustomError(
                REFUSED_VALUE, "profile '{value}' is refused: " + PROFILE_REASON, {"value": v}
            )
        return v

    engine_args: EngineArgs = Field(default_factory=EngineArgs)
    """Batch limits and precision shared by every replica (see EngineArgs)."""

    timeout_ms: TimeoutMs = DEFAULT_TIMEOUT_MS
    """Deadline of one exchange with a worker, in ms (default 30000); a caller's deadline can be
    shorter. An exchange past it counts toward outlier ejection."""

    hang_after_ms: HangAfterMs | None = None
    """A managed worker whose forward has run longer than this (its own /health says so) is
    hung: the supervisor restarts it. Default: max(3 x timeout_ms, 10000)."""

    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)
    """Intra-op threads of each of this deployment's CPU workers (--threads writes it; point it
    at the count the adaptive learner reports). Capped at the CPU budget; takes precedence over
    VLLM_SRUN_CPU_THREADS for this deployment. Unset: VLLM_SRUN_CPU_THREADS, else half the
    budget. Refused on GPU deployments and on deployments with only attached replicas."""

    replicas: list[Replica] | None = Field(default=None, min_length=1, max_length=MAX_REPLICAS)
    """Independent workers, each with its own copy of the weights (at most 64). Not to be
    combined with a deployment-level device or endpoint."""

    device: DeviceStr | None = None
    """One-worker shorthand: the device of the single managed worker. Omitting replicas,
    device and endpoint means one CPU worker."""

    endpoint: EndpointStr | None = None
    """One-worker shorthand: the URL of a single attached runtime."""

    model: str | None = None
    """With the endpoint shorthand: the attached runtime's served model name."""

    outlier_detection: OutlierDetection = Field(default_factory=OutlierDetection)
    """Ejection of replicas that keep timing out (every field optional)."""

    def effective_replicas(self) -> list[Replica]:
        """The canonical replica list: the authored one, or the shorthand as one replica."""
        if self.replicas:
            return list(self.replicas)
        if self.endpoint is not None:
            return [Replica(endpoint=self.endpoint, model=self.model)]
        return [Replica(device=self.device or "cpu")]

    @property
    def platform(self) -> str | None:
        """cpu, rocm or cuda for managed workers (auto before the planner resolves it); None when
        every replica is attached."""
        for r in self.effective_replicas():
            if r.device is not None:
                return device_platform(r.device)
        return None
