"""pydantic models of config.yaml (the canonical resource).

Every model forbids unknown keys and documents each field with an attribute docstring (pydantic
turns them into field descriptions, which ``vllm-sr config show --json`` and docs/config.md use).
Cross-field rules of the product page ("What replicas share") live in :func:`semantic_problems`,
which works on the raw mapping so that a file with both field errors and rule errors gets every
problem reported in one run; the models call it too, so code that builds a config directly gets
the same checks.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from vllm_sr.config.problems import SEMANTIC_ERROR, Problem
from vllm_sr.config.routing import DEFAULT_AUTO_MODEL_NAMES, Providers, Routing
from vllm_sr.config.routing_rules import routing_problems
from vllm_sr.endpoint import ENDPOINT_ACCEPTED, endpoint_problem

DEVICE_RE = re.compile(r"^(cpu|rocm:(0|[1-9][0-9]{0,3})|cuda:(0|[1-9][0-9]{0,3}))$")
DEVICE_ACCEPTED = "cpu, rocm:N or cuda:N (N a GPU index, e.g. rocm:0)"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
NAME_ACCEPTED = "1-63 characters: letters, digits, '_', '.', '-', starting with a letter or digit"
MAX_REPLICAS = 64
MAX_THREADS = 1024
MAX_EJECTION_MS_LIMIT = 3_600_000
DEFAULT_TIMEOUT_MS = 30_000
# Outlier detection defaults: their one home (the pool's settings read them from here).
DEFAULT_CONSECUTIVE_TIMEOUTS = 3
DEFAULT_BASE_EJECTION_MS = 30_000
DEFAULT_MAX_EJECTION_PERCENT = 50
DEFAULT_ARTIFACT = "vllm-sr/d3-edge"

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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, populate_by_name=True)


class EngineArgs(_Strict):
    max_num_seqs: int | None = Field(default=None, ge=1, le=65536)
    """Most rows one forward batches together. Unset: the worker's default. Set it to give
    every replica the same limit; a replica reporting another value is kept out of dispatch."""

    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=16_777_216)
    """Most tokens one forward batches together. Unset: each worker calibrates its own budget at
    startup, so replicas may report different values."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Precision of the forward. auto (default): on a GPU bfloat16 where the device has it,
    else float16; on a CPU bfloat16 when it has native bf16 (AMX or AVX512-BF16), else
    float32. An explicit value is honoured (a slow one is warned about). Every replica reports
    the dtype it resolved; one that differs from its peers is kept out of dispatch."""


class OutlierDetection(_Strict):
    consecutive_timeouts: int = Field(default=DEFAULT_CONSECUTIVE_TIMEOUTS, ge=0, le=1000)
    """Exchanges in a row that run past their deadline before a replica is ejected; 0 = off."""

    base_ejection_ms: int = Field(default=DEFAULT_BASE_EJECTION_MS, ge=1, le=MAX_EJECTION_MS_LIMIT)
    """First ejection's length in ms; each repeat doubles it up to max_ejection_ms."""

    max_ejection_ms: int | None = Field(default=None, ge=1, le=MAX_EJECTION_MS_LIMIT)
    """Longest ejection in ms. Default: ten times base_ejection_ms, at most 3600000 (an hour).
    Must not be below base_ejection_ms."""

    max_ejection_percent: int = Field(default=DEFAULT_MAX_EJECTION_PERCENT, ge=0, le=100)
    """Most replicas (percent) out at once; one may always be out."""

    @model_validator(mode="after")
    def _fill_max(self) -> OutlierDetection:
        problem = ejection_bounds_problem(self.base_ejection_ms, self.max_ejection_ms)
        if problem is not None:
            raise PydanticCustomError(SEMANTIC_ERROR, problem)
        if self.max_ejection_ms is None:
            self.max_ejection_ms = default_max_ejection_ms(self.base_ejection_ms)
        return self


class Replica(_Strict):
    device: DeviceStr | None = None
    """Managed worker placement: cpu, rocm:N or cuda:N. N is a host GPU index, or, when the
    process was given GPUs (a *_VISIBLE_DEVICES variable set, or a Kubernetes pod), an
    allocation ordinal into them."""

    endpoint: EndpointStr | None = None
    """Attached runtime URL (http://HOST:PORT or unix:/path); the runtime manages itself."""

    model: str | None = None
    """Served model name of an attached replica (required with endpoint)."""

    @property
    def attached(self) -> bool:
        return self.endpoint is not None


class Deployment(_Strict):
    provider: Literal["model_runtime"] = "model_runtime"
    """Who runs the workers; only model_runtime (vllm-sr's own workers) exists."""

    artifact: str = Field(default=DEFAULT_ARTIFACT, min_length=1, max_length=512)
    """Model artifact: a built-in name such as vllm-sr/d3-edge, or a local directory."""

    revision: str | None = Field(default=None, max_length=128)
    """Artifact revision; every replica uses the same one."""

    engine_args: EngineArgs = Field(default_factory=EngineArgs)
    """Batch limits and precision shared by every replica (see EngineArgs)."""

    timeout_ms: int = Field(default=DEFAULT_TIMEOUT_MS, ge=1, le=3_600_000)
    """Deadline of one exchange with a worker, in ms (default 30000); a caller's deadline can be
    shorter. An exchange past it counts toward outlier ejection."""

    hang_after_ms: int | None = Field(default=None, ge=1000, le=86_400_000)
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
        """cpu, rocm or cuda for managed workers; None when every replica is attached."""
        for r in self.effective_replicas():
            if r.device is not None:
                return device_platform(r.device)
        return None


class Router(_Strict):
    enabled: bool = True
    """Routing consumers on. Engine mode (-e / --engine) writes false."""

    auto_model_names: list[str] = Field(
        default_factory=lambda: list(DEFAULT_AUTO_MODEL_NAMES), min_length=1, max_length=16
    )
    """Chat model names that mean "route this request" (default: vllm-sr/auto, auto)."""


class DecisionModel(_Strict):
    deployment: str
    """The deployment that serves the decision model; -dp and MODEL act on it."""


class System(_Strict):
    decision_model: DecisionModel | None = None
    """Where routing decisions are computed; default: the first declared deployment."""


class ModelCatalog(_Strict):
    deployments: dict[str, Deployment] = Field(min_length=1)
    """Logical deployments by name; a replica's id is <name>-<index>."""

    system: System = Field(default_factory=System)
    """System models and the deployments that serve them."""


class GlobalSection(_Strict):
    router: Router = Field(default_factory=Router)
    """Routing front settings."""

    model_catalog: ModelCatalog
    """Deployments and system models."""


class RootConfig(_Strict):
    global_: GlobalSection = Field(alias="global")
    """Deployments, system models and the router's switches."""

    providers: Providers | None = None
    """OpenAI-compatible LLM backends that chat requests go to (Router mode)."""

    routing: Routing | None = None
    """Signals and decisions (Router mode)."""

    @model_validator(mode="after")
    def _rules(self) -> RootConfig:
        problems = semantic_problems(self.model_dump(by_alias=True, exclude_none=True))
        if problems:
            raise PydanticCustomError(SEMANTIC_ERROR, "; ".join(p.render_plain() for p in problems))
        return self

    @property
    def deployments(self) -> dict[str, Deployment]:
        return self.global_.model_catalog.deployments

    def default_deployment(self) -> str:
        """The decision model's deployment, else the first declared one (the target of -dp)."""
        dm = self.global_.model_catalog.system.decision_model
        if dm is not None:
            return dm.deployment
        return next(iter(self.deployments))


def _deployment_problems(name: str, dep: dict[str, Any]) -> list[Problem]:
    base: tuple[str | int, ...] = ("global", "model_catalog", "deployments", name)
    problems: list[Problem] = []
    if not NAME_RE.match(name):
        problems.append(
            Problem(base, f"deployment name {name!r} is not accepted; accepted: {NAME_ACCEPTED}")
        )
    replicas = dep.get("replicas")
    for key in ("device", "endpoint"):
        if replicas is not None and dep.get(key) is not None:
            problems.append(
                Problem(
                    (*base, key),
                    f"{key} {dep.get(key)!r} is set together with replicas; accepted: either "
                    f"replicas or the one-worker shorthand {key}, not both (move it into replicas)",
                )
            )
    if dep.get("device") is not None and dep.get("endpoint") is not None:
        problems.append(
            Problem((*base, "endpoint"), "device and endpoint are both set; accepted: one of them")
        )
    if dep.get("model") is not None and dep.get("endpoint") is None:
        problems.append(
            Problem(
                (*base, "model"),
                f"model {dep.get('model')!r} without endpoint; accepted: model only names an "
                "attached runtime's served model (set endpoint, or remove model)",
            )
        )
    if dep.get("endpoint") is not None and not dep.get("model"):
        problems.append(
            Problem((*base, "model"), "endpoint shorthand without model; accepted: model: NAME")
        )
    problems += _replica_problems(base, replicas)
    problems += _outlier_problems(base, dep.get("outlier_detection"))
    problems += _threads_problems(base, dep)
    return problems


def _threads_problems(base: tuple[str | int, ...], dep: dict[str, Any]) -> list[Problem]:
    """``threads`` sizes vllm-sr's own CPU workers; a GPU worker or an attached runtime has
    nothing it could apply to, so it is refused rather than silently ignored."""
    threads = dep.get("threads")
    if threads is None:
        return []
    replicas = dep.get("replicas")
    if isinstance(replicas, list):
        devices = [r.get("device") for r in replicas if isinstance(r, dict)]
    elif dep.get("endpoint") is not None:
        devices = [None]
    else:
        devices = [dep.get("device") or "cpu"]
    gpu = next((d for d in devices if isinstance(d, str) and d != "cpu"), None)
    if gpu is not None:
        return [
            Problem(
                (*base, "threads"),
                f"threads {threads!r} applies to CPU workers, but this deployment runs on "
                f"{device_platform(gpu)} GPUs ({gpu}); accepted: remove threads, or place the "
                "deployment on cpu",
            )
        ]
    if "cpu" not in devices:
        return [
            Problem(
                (*base, "threads"),
                f"threads {threads!r} on a deployment whose replicas are all attached "
                "(endpoint): attached runtimes manage their own threads; accepted: remove threads",
            )
        ]
    return []


def _outlier_problems(base: tuple[str | int, ...], od: Any) -> list[Problem]:
    if not isinstance(od, dict):
        return []
    top, low = od.get("max_ejection_ms"), od.get("base_ejection_ms", DEFAULT_BASE_EJECTION_MS)
    if isinstance(top, int) and isinstance(low, int):
        problem = ejection_bounds_problem(low, top)
        if problem is not None:
            return [Problem((*base, "outlier_detection", "max_ejection_ms"), problem)]
    return []


def _replica_problems(base: tuple[str | int, ...], replicas: Any) -> list[Problem]:
    if not isinstance(replicas, list):
        return []
    problems: list[Problem] = []
    platforms: dict[str, int] = {}
    for i, rep in enumerate(replicas):
        if not isinstance(rep, dict):
            continue
        path = (*base, "replicas", i)
        dev, ep, model = rep.get("device"), rep.get("endpoint"), rep.get("model")
        if dev is None and ep is None:
            problems.append(
                Problem(
                    path,
                    "replica has neither device nor endpoint; accepted: {device: "
                    "DEVICE} or {endpoint: URL, model: NAME}",
                )
            )
        if dev is not None and ep is not None:
            problems.append(
                Problem(path, "replica sets both device and endpoint; accepted: one of them")
            )
        if ep is not None and not model:
            problems.append(
                Problem(
                    (*path, "model"),
                    f"attached replica {ep!r} has no model; accepted: the "
                    "runtime's served model name, e.g. model: primary",
                )
            )
        if model is not None and ep is None:
            problems.append(
                Problem(
                    (*path, "model"),
                    f"model {model!r} on a managed replica; accepted: model only with endpoint",
                )
            )
        if isinstance(dev, str) and DEVICE_RE.match(dev):
            platforms.setdefault(device_platform(dev), i)
    if len(platforms) > 1:
        first, *rest = sorted(platforms.items(), key=lambda kv: kv[1])
        for plat, idx in rest:
            problems.append(
                Problem(
                    (*base, "replicas", idx, "device"),
                    f"platform {plat!r} differs from {first[0]!r} of replicas[{first[1]}]; "
                    "accepted: one platform per deployment (split it into two deployments)",
                )
            )
    return problems


def semantic_problems(raw: Any) -> list[Problem]:
    """The product page's cross-field rules, on the raw mapping (tolerates wrong types: those
    are reported by the field validation)."""
    if not isinstance(raw, dict):
        return []
    catalog = (
        (raw.get("global") or {}).get("model_catalog")
        if isinstance(raw.get("global"), dict)
        else None
    )
    if not isinstance(catalog, dict):
        return []
    deployments = catalog.get("deployments")
    problems: list[Problem] = []
    names: list[str] = []
    if isinstance(deployments, dict):
        for name, dep in deployments.items():
            names.append(str(name))
            if isinstance(dep, dict):
                problems += _deployment_problems(str(name), dep)
    system = catalog.get("system")
    dm = system.get("decision_model") if isinstance(system, dict) else None
    target = dm.get("deployment") if isinstance(dm, dict) else None
    if isinstance(target, str) and isinstance(deployments, dict) and target not in names:
        problems.append(
            Problem(
                ("global", "model_catalog", "system", "decision_model", "deployment"),
                f"{target!r} names no deployment; accepted: one of "
                f"{', '.join(names) or '(none declared)'}",
            )
        )
    return problems + routing_problems(raw)
