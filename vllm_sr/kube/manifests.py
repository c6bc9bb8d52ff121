"""config.yaml -> Kubernetes objects (plain dicts, in apply order).

One host group is a StatefulSet whose pods each run ``vllm-sr serve`` with the same config,
mounted from the group's ConfigMap (with the host settings the pod needs), a headless Service
(each pod gets a DNS name), and a PodDisruptionBudget. The group that answers clients also has
a ClusterIP Service on the frontend port.

Without ``frontend_pods`` there is one group running the config as written. With
``frontend_pods=N`` the config's managed replicas run in a group of N worker pods, and a
frontend group runs the same deployments with one ``endpoint:`` replica per worker pod
(``http://<workers>-<i>.<workers>[.<namespace>.svc]:<port>``, the headless Service's names), so
one frontend balances over several pods with the pool's usual dispatch, ejection and retries.
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass
from typing import Any

import tomlkit
from ruamel.yaml import YAML

from vllm_sr import __version__
from vllm_sr.config.files import effective_dict, parse_config
from vllm_sr.config.schema import RootConfig
from vllm_sr.config.service import ServiceSettings
from vllm_sr.errors import PlacementError, UsageError
from vllm_sr.kube.pod import (
    CONFIG_PATH,
    METRICS_PATH,
    PORT_NAME,
    RUNTIME_DIR,
    SERVICE_TOML,
    STATE_DIR,
    PodTiming,
    pod_spec,
)
from vllm_sr.kube.sizing import PodSizing, size_pod

# A StatefulSet's pods are <name>-<ordinal> and their hostname is a DNS label (63), and the
# controller adds a revision hash label to <name>: keep names short.
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_NAME_ACCEPTED = "1-40 characters: lowercase letters, digits and '-', starting with a letter"
_NS_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DEFAULT_PORT = 8080
MAX_PODS = 64


@dataclass(frozen=True)
class RenderOptions:
    name: str = "vllm-sr"
    namespace: str | None = None
    image: str | None = None
    """None: vllm-sr:<version>-<platform>, the tag the Containerfile's docs build."""
    pods: int = 1
    """Pods of the group that answers clients."""
    frontend_pods: int | None = None
    """Worker pods behind one frontend (None: every pod serves the whole config itself)."""
    cpu_threads: int = 2
    port: int = DEFAULT_PORT
    timing: PodTiming | None = None
    """None: the host settings' defaults (vllm_sr/config/service.py)."""

    def check(self) -> None:
        if not _NAME_RE.match(self.name):
            raise UsageError(f"--name {self.name!r}: accepted: {_NAME_ACCEPTED}")
        if self.namespace is not None and not _NS_RE.match(self.namespace):
            raise UsageError(
                f"--namespace {self.namespace!r}: accepted: a DNS label (lowercase letters, "
                "digits and '-', at most 63)"
            )
        for flag, value in (("--pods", self.pods), ("--frontend-pods", self.frontend_pods)):
            if value is not None and not 1 <= value <= MAX_PODS:
                raise UsageError(f"{flag} {value}: accepted: 1..{MAX_PODS}")

    def pod_timing(self) -> PodTiming:
        if self.timing is not None:
            return self.timing
        d = ServiceSettings()
        return PodTiming(d.ready_timeout_s, d.drain_timeout_s, d.stop_grace_s)


@dataclass(frozen=True)
class HostGroup:
    name: str
    component: str  # serve | frontend | workers
    pods: int
    config_text: str
    sizing: PodSizing
    headless: str
    public: bool
    publish_not_ready: bool = False

    @property
    def config_map(self) -> str:
        return f"{self.name}-config"


def service_toml(opts: RenderOptions) -> str:
    """The host settings inside the pod: listen on every address, sockets in the emptyDir."""
    t = opts.pod_timing()
    doc = tomlkit.document()
    doc.add(tomlkit.comment("vllm-sr host settings inside a pod (vllm-sr render kubernetes)"))
    doc.add("listen", f"0.0.0.0:{opts.port}")
    doc.add("runtime_dir", RUNTIME_DIR)
    doc.add("control_socket", f"{RUNTIME_DIR}/control.sock")
    doc.add("state_dir", STATE_DIR)
    doc.add("log_format", "json")
    doc.add("ready_timeout_s", float(t.ready_timeout_s))
    doc.add("drain_timeout_s", float(t.drain_timeout_s))
    doc.add("stop_grace_s", float(t.stop_grace_s))
    return tomlkit.dumps(doc)


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_none(v) for v in value]
    return value


def worker_endpoints(opts: RenderOptions, workers: str, count: int) -> list[str]:
    domain = f".{opts.namespace}.svc" if opts.namespace else ""
    return [f"http://{workers}-{i}.{workers}{domain}:{opts.port}" for i in range(count)]


def frontend_config_text(config: RootConfig, endpoints: list[str], source: str) -> str:
    """The same deployments, each with one attached replica per worker pod."""
    data = _strip_none(effective_dict(config))
    for name, dep in data["global"]["model_catalog"]["deployments"].items():
        dep["replicas"] = [{"endpoint": url, "model": name} for url in endpoints]
        dep.pop("hang_after_ms", None)  # a managed worker's setting
    y = YAML(typ="safe", pure=True)
    y.default_flow_style = False
    y.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
    buf = io.StringIO()
    buf.write(
        f"# Frontend of {len(endpoints)} worker pod(s); generated by `vllm-sr render "
        f"kubernetes --frontend-pods {len(endpoints)}` from {source}.\n"
    )
    y.dump(data, buf)
    text = buf.getvalue()
    parse_config(text, "frontend config.yaml")  # a generated config that would not load is a bug
    return text


def _refuse_attached(config: RootConfig) -> None:
    for name, dep in config.deployments.items():
        for i, rep in enumerate(dep.effective_replicas()):
            if rep.endpoint is not None:
                raise PlacementError(
                    f"replica {name}-{i}: endpoint {rep.endpoint} is attached; --frontend-pods "
                    "turns every deployment's replicas into endpoints on the worker pods; "
                    "accepted: a config of managed replicas (device: ...) only, or render "
                    "without --frontend-pods",
                    replica=f"{name}-{i}",
                )


def host_groups(config: RootConfig, text: str, source: str, opts: RenderOptions) -> list[HostGroup]:
    sizing = size_pod(config, opts.cpu_threads)
    if opts.frontend_pods is None:
        return [HostGroup(opts.name, "serve", opts.pods, text, sizing, f"{opts.name}-pods", True)]
    _refuse_attached(config)
    workers = f"{opts.name}-workers"
    front_text = frontend_config_text(
        config, worker_endpoints(opts, workers, opts.frontend_pods), source
    )
    front = parse_config(front_text, "frontend config.yaml")
    return [
        HostGroup(workers, "workers", opts.frontend_pods, text, sizing, workers, False, True),
        HostGroup(
            opts.name,
            "frontend",
            opts.pods,
            front_text,
            size_pod(front, opts.cpu_threads),
            f"{opts.name}-pods",
            True,
        ),
    ]


def _meta(name: str, opts: RenderOptions, labels: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    meta["labels"] = {**labels, "app.kubernetes.io/version": __version__}
    return meta


def _selector(opts: RenderOptions, group: HostGroup) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "vllm-sr",
        "app.kubernetes.io/instance": opts.name,
        "app.kubernetes.io/component": group.component,
    }


def _service(name: str, opts: RenderOptions, group: HostGroup, headless: bool) -> dict[str, Any]:
    sel = _selector(opts, group)
    spec: dict[str, Any] = {
        "selector": sel,
        "ports": [{"name": PORT_NAME, "port": opts.port, "targetPort": PORT_NAME}],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = group.publish_not_ready
    else:
        spec["type"] = "ClusterIP"
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, opts, sel), "spec": spec}


def _statefulset(opts: RenderOptions, group: HostGroup, toml_text: str) -> dict[str, Any]:
    sel = _selector(opts, group)
    # Only the host settings: they are read once, at start. config.yaml is not in the
    # template: serve's watch applies a ConfigMap update in the running pods (no roll), and a
    # change that moves the pod's resources (GPUs, CPU workers) changes the template anyway.
    digest = hashlib.sha256(toml_text.encode()).hexdigest()
    image = opts.image or f"vllm-sr:{__version__}-{group.sizing.platform}"
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(opts.port),
        "prometheus.io/path": METRICS_PATH,
        # Changed host settings change the template, so the pods roll onto them.
        "vllm-sr/host-settings-sha256": digest,
        "vllm-sr/cpu-budget": group.sizing.budget_note,
    }
    spec = pod_spec(image, opts.port, group.sizing, opts.pod_timing(), group.config_map)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(group.name, opts, sel),
        "spec": {
            "serviceName": group.headless,
            "replicas": group.pods,
            # Pods are independent copies: start and replace them in parallel.
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": sel},
            "template": {"metadata": {"labels": sel, "annotations": annotations}, "spec": spec},
        },
    }


def group_objects(opts: RenderOptions, group: HostGroup) -> list[dict[str, Any]]:
    sel = _selector(opts, group)
    toml_text = service_toml(opts)
    objs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(group.config_map, opts, sel),
            "data": {CONFIG_PATH.rsplit("/", 1)[1]: group.config_text, SERVICE_TOML: toml_text},
        },
        _service(group.headless, opts, group, headless=True),
    ]
    if group.public:
        objs.append(_service(opts.name, opts, group, headless=False))
    objs.append(_statefulset(opts, group, toml_text))
    objs.append(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(group.name, opts, sel),
            # One pod at a time: a drain never takes the whole group, and a one-pod group
            # can still be evicted (minAvailable 1 would block node drains for ever).
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": sel}},
        }
    )
    return objs


def render(text: str, source: str, opts: RenderOptions) -> list[dict[str, Any]]:
    """config.yaml text -> the objects, in apply order. Raises ConfigError (bad config),
    UsageError (bad options) or PlacementError (a config that cannot run in a pod)."""
    opts.check()
    config = parse_config(text, source)
    objs: list[dict[str, Any]] = []
    for group in host_groups(config, text, source, opts):
        objs += group_objects(opts, group)
    return objs
