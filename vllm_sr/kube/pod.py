"""The pod template of one host group: the container that runs ``vllm-sr serve`` with the
config from its ConfigMap, its probes, its drain on termination, and its volumes.

- Probes: startup and readiness on ``/health`` (200 only while every deployment has a ready
  replica and the service is not stopping); liveness on ``/v1/models``, which the frontend
  answers from the pools' in-memory state: neither a hung forward nor a worker restart
  blocks or fails it, so liveness restarts the pod only when its event loop stops answering.
- Termination: ``preStop`` sleeps so that endpoint controllers and kube-proxy stop routing to
  the pod first; then the kubelet's SIGTERM makes serve stop admitting, drain its requests
  (``drain_timeout_s``), SIGTERM its workers and wait ``stop_grace_s``.
  ``terminationGracePeriodSeconds`` covers all of it plus a margin.
- The control socket lives in an emptyDir at /run/vllm-sr, so ``kubectl exec POD -- vllm-sr
  status`` (which reads /etc/vllm-sr/vllm-sr.toml to find it) works and nothing outside the pod
  can reach it. Root filesystem read-only; everything written goes to emptyDirs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vllm_sr.kube.sizing import PodSizing

CONFIG_DIR = "/etc/vllm-sr"
CONFIG_PATH = f"{CONFIG_DIR}/config.yaml"
SERVICE_TOML = "vllm-sr.toml"
RUNTIME_DIR = "/run/vllm-sr"
STATE_DIR = "/var/lib/vllm-sr"
CACHE_DIR = "/var/cache/vllm-sr"
CONTAINER_NAME = "vllm-sr"
PORT_NAME = "http"
READINESS_PATH = "/health"
LIVENESS_PATH = "/v1/models"
METRICS_PATH = "/metrics"
# The image's user (packaging/container/Containerfile creates it with these ids).
RUN_AS_UID = 10001
RUN_AS_GID = 10001
STARTUP_PERIOD_S = 5
GRACE_MARGIN_S = 5
COMMAND = ["vllm-sr", "serve", "--config", CONFIG_PATH]


@dataclass(frozen=True)
class PodTiming:
    """Service settings the pod's lifecycle derives from (vllm_sr/config/service.py)."""

    ready_timeout_s: float
    drain_timeout_s: float
    stop_grace_s: float
    prestop_sleep_s: int = 5

    @property
    def termination_grace_s(self) -> int:
        total = self.prestop_sleep_s + self.drain_timeout_s + self.stop_grace_s + GRACE_MARGIN_S
        return math.ceil(total)

    @property
    def startup_failures(self) -> int:
        """Enough startup probes to outlast the slowest worker start the service allows."""
        return math.ceil(self.ready_timeout_s / STARTUP_PERIOD_S) + 1


def _probe(path: str, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _env(sizing: PodSizing) -> list[dict[str, Any]]:
    env = {
        "VLLM_SR_LOG_FORMAT": "json",
        "HOME": STATE_DIR,
        "HF_HOME": f"{CACHE_DIR}/huggingface",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        **sizing.env(),
    }
    return [{"name": k, "value": v} for k, v in env.items()]


def _mounts() -> list[dict[str, Any]]:
    return [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "run", "mountPath": RUNTIME_DIR},
        {"name": "state", "mountPath": STATE_DIR},
        {"name": "cache", "mountPath": CACHE_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
    ]


def volumes(config_map: str) -> list[dict[str, Any]]:
    return [
        {"name": "config", "configMap": {"name": config_map, "defaultMode": 0o444}},
        # Sockets only: small, and in memory so a node's disk pressure never evicts them.
        {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        {"name": "state", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]


def container(image: str, port: int, sizing: PodSizing, timing: PodTiming) -> dict[str, Any]:
    limits = sizing.limits()
    return {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(COMMAND),
        "ports": [{"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "env": _env(sizing),
        # GPUs are extended resources: Kubernetes takes them from limits (requests follow).
        "resources": {"requests": {"cpu": limits["cpu"]}, "limits": limits},
        "startupProbe": _probe(READINESS_PATH, STARTUP_PERIOD_S, 2, timing.startup_failures),
        "readinessProbe": _probe(READINESS_PATH, 5, 2, 2),
        "livenessProbe": _probe(LIVENESS_PATH, 10, 5, 3),
        "lifecycle": {
            "preStop": {"exec": {"command": ["sleep", str(timing.prestop_sleep_s)]}},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": _mounts(),
    }


def pod_spec(
    image: str, port: int, sizing: PodSizing, timing: PodTiming, config_map: str
) -> dict[str, Any]:
    return {
        "terminationGracePeriodSeconds": timing.termination_grace_s,
        # Service links would put VLLM_SR_* variables (from a Service named vllm-sr) into the
        # environment, where vllm-sr reads its own settings.
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_UID,
            "runAsGroup": RUN_AS_GID,
            "fsGroup": RUN_AS_GID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container(image, port, sizing, timing)],
        "volumes": volumes(config_map),
    }
