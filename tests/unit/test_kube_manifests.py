"""`vllm-sr render kubernetes`: the rendered objects validate against the Kubernetes OpenAPI
models offline (the `kubernetes` client's models: every object deserialised through its
ApiClient, required fields and types checked, and serialised back unchanged, so a misspelt or
unknown field is caught too), for cpu, rocm and cuda configs; GPU limits from the ordinals,
CPU from the budget rules, probes, drain, PDB, and each refusal."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient

from vllm_sr.config.files import dump_document, parse_config, parse_document
from vllm_sr.config.service import load_service_settings
from vllm_sr.errors import EXIT_DO_NOT_RESTART, PlacementError, UsageError
from vllm_sr.kube.manifests import RenderOptions, render
from vllm_sr.kube.output import to_stream, write_dir
from vllm_sr.kube.pod import PodTiming

REPO_ROOT = Path(__file__).resolve().parents[2]
_API = ApiClient()


def openapi_problems(obj: dict[str, Any]) -> list[str]:
    """Deserialise ``obj`` into its OpenAPI model and back; any difference is a problem."""
    group_version = obj.get("apiVersion", "")
    version = group_version.rsplit("/", 1)[-1]
    cls = f"{version.capitalize()}{obj.get('kind', '')}"
    try:
        model = _API._ApiClient__deserialize(obj, cls)  # type: ignore[attr-defined]
    except Exception as exc:  # the client raises pydantic/ValueError/AttributeError alike
        return [f"{cls}: {exc}"]
    back = _API.sanitize_for_serialization(model)
    if back != obj:
        return [f"{cls} {obj['metadata']['name']}: fields lost or changed: {_diff(obj, back)}"]
    return []


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _diff(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


def config_yaml(*devices: str, extra: str = "") -> str:
    reps = "\n".join(f"          - device: {d}" for d in devices)
    return (
        textwrap.dedent(
            """\
        global:
          router:
            enabled: false
          model_catalog:
            deployments:
              primary:
                artifact: vllm-sr/d3-edge
                replicas:
        """
        )
        + reps
        + "\n"
        + extra
    )


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def container_of(sts: dict[str, Any]) -> dict[str, Any]:
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    return dict(c)


def validated(text: str, **opts: Any) -> list[dict[str, Any]]:
    objs = render(text, "config.yaml", RenderOptions(**opts))
    # Through YAML and back, as kubectl would read it.
    docs = [d for d in yaml.safe_load_all(to_stream(objs)) if d is not None]
    assert docs == objs
    problems = [p for o in docs for p in openapi_problems(o)]
    assert problems == []
    return docs


@pytest.mark.parametrize(
    ("devices", "resource", "count", "cpus", "image"),
    [
        (("cpu", "cpu"), None, 0, 1 + 2 * 2, "vllm-sr:0.1.0-cpu"),
        (("rocm:0", "rocm:1"), "amd.com/gpu", 2, 1 + 2, "vllm-sr:0.1.0-rocm"),
        (("rocm:0", "rocm:0", "rocm:1"), "amd.com/gpu", 2, 1 + 3, "vllm-sr:0.1.0-rocm"),
        (("cuda:1", "cuda:0"), "nvidia.com/gpu", 2, 1 + 2, "vllm-sr:0.1.0-cuda"),
    ],
)
def test_cpu_rocm_cuda_configs_validate_and_size_the_pod(
    devices: tuple[str, ...], resource: str | None, count: int, cpus: int, image: str
) -> None:
    objs = validated(config_yaml(*devices), namespace="ml")
    assert [o["kind"] for o in objs] == [
        "ConfigMap", "Service", "Service", "StatefulSet", "PodDisruptionBudget"
    ]  # fmt: skip
    (sts,) = by_kind(objs, "StatefulSet")
    c = container_of(sts)
    limits = c["resources"]["limits"]
    assert c["resources"]["requests"] == {"cpu": str(cpus)} and limits["cpu"] == str(cpus)
    gpu_keys = {k for k in limits if k.endswith("/gpu")}
    assert gpu_keys == ({resource} if resource else set())
    if resource:
        assert limits[resource] == str(count)
    assert c["image"] == image
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["VLLM_SR_LOG_FORMAT"] == "json"
    assert ("VLLM_SRUN_CPU_THREADS" in env) == ("cpu" in devices)
    assert all(o["metadata"]["namespace"] == "ml" for o in objs)


def test_pod_runs_serve_with_the_config_from_the_configmap() -> None:
    text = config_yaml("rocm:0", "rocm:1") + "  # a comment kept verbatim\n"
    objs = validated(text)
    cm, sts = by_kind(objs, "ConfigMap")[0], by_kind(objs, "StatefulSet")[0]
    assert cm["data"]["config.yaml"] == text
    # serve writes config.yaml only when its round trip changes it: a read-only mount is fine.
    assert dump_document(parse_document(text)) == text
    c = container_of(sts)
    assert c["command"] == ["vllm-sr", "serve", "--config", "/etc/vllm-sr/config.yaml"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/etc/vllm-sr"]["readOnly"] is True
    vols = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert vols[mounts["/etc/vllm-sr"]["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    # The host settings: every address, the control socket inside the pod's emptyDir.
    settings = _settings(cm["data"]["vllm-sr.toml"])
    assert settings.listen == "0.0.0.0:8080"
    assert str(settings.control_socket).startswith(mounts["/run/vllm-sr"]["mountPath"])
    assert "emptyDir" in vols[mounts["/run/vllm-sr"]["name"]]


def _settings(text: str) -> Any:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(text)
        f.flush()
        return load_service_settings(f.name)


def test_probes_drain_grace_security_and_scraping() -> None:
    objs = validated(config_yaml("cpu"))
    sts = by_kind(objs, "StatefulSet")[0]
    spec = sts["spec"]["template"]["spec"]
    c = container_of(sts)
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    # Liveness must not be /health: a pod whose workers are all restarting is alive.
    assert c["livenessProbe"]["httpGet"]["path"] == "/v1/models"
    # Startup outlasts the service's own worker ready timeout (600 s).
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] > 600
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    # preStop 5 + drain 30 + stop grace 10 + margin 5
    assert spec["terminationGracePeriodSeconds"] == 50
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["enableServiceLinks"] is False
    ann = sts["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert ann["prometheus.io/port"] == "8080" and ann["prometheus.io/path"] == "/metrics"
    (pdb,) = by_kind(objs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    svc = [s for s in by_kind(objs, "Service") if s["spec"].get("type") == "ClusterIP"]
    assert svc[0]["spec"]["selector"] == sts["spec"]["template"]["metadata"]["labels"]
    headless = [s for s in by_kind(objs, "Service") if s["spec"].get("clusterIP") == "None"]
    assert headless[0]["metadata"]["name"] == sts["spec"]["serviceName"]


def template_of(text: str, **opts: Any) -> dict[str, Any]:
    return dict(by_kind(validated(text, **opts), "StatefulSet")[0]["spec"]["template"])


def test_a_config_change_the_watch_applies_does_not_roll_the_pods() -> None:
    # The ConfigMap changes (the running pods' watch applies it); the pod template does not.
    a = validated(config_yaml("cuda:0"))
    b = validated(config_yaml("cuda:0").replace("vllm-sr/d3-edge", "vllm-sr/d3-edge-v2"))
    assert by_kind(a, "ConfigMap") != by_kind(b, "ConfigMap")
    assert (
        by_kind(a, "StatefulSet")[0]["spec"]["template"]
        == (by_kind(b, "StatefulSet")[0]["spec"]["template"])
    )


def test_a_change_of_the_pods_resources_or_host_settings_rolls_them() -> None:
    one = template_of(config_yaml("cuda:0"))
    assert template_of(config_yaml("cuda:0", "cuda:1")) != one  # two GPUs: a new pod
    assert template_of(config_yaml("cpu")) != template_of(config_yaml("cpu", "cpu"))  # CPUs
    timing = PodTiming(ready_timeout_s=600.0, drain_timeout_s=90.0, stop_grace_s=10.0)
    key = "vllm-sr/host-settings-sha256"
    slow = template_of(config_yaml("cuda:0"), timing=timing)
    assert slow["metadata"]["annotations"][key] != one["metadata"]["annotations"][key]


def test_cpu_threads_follow_the_budget_rules() -> None:
    sts = by_kind(validated(config_yaml("cpu", "cpu", "cpu"), cpu_threads=4), "StatefulSet")[0]
    c = container_of(sts)
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["VLLM_SRUN_CPU_THREADS"] == "4"
    assert c["resources"]["limits"]["cpu"] == str(1 + 3 * 4)
    with pytest.raises(UsageError, match="--cpu-threads 0"):
        render(config_yaml("cpu"), "c", RenderOptions(cpu_threads=0))


def test_frontend_pods_attach_worker_pods_through_the_headless_service() -> None:
    objs = validated(config_yaml("cuda:0", "cuda:1"), namespace="ml", frontend_pods=3)
    sets = {o["metadata"]["name"]: o for o in by_kind(objs, "StatefulSet")}
    assert set(sets) == {"vllm-sr-workers", "vllm-sr"}
    workers, front = sets["vllm-sr-workers"], sets["vllm-sr"]
    assert workers["spec"]["replicas"] == 3 and front["spec"]["replicas"] == 1
    assert container_of(workers)["resources"]["limits"]["nvidia.com/gpu"] == "2"
    front_limits = container_of(front)["resources"]["limits"]
    assert front_limits == {"cpu": "1"} and container_of(front)["image"] == "vllm-sr:0.1.0-cpu"
    services = {o["metadata"]["name"]: o for o in by_kind(objs, "Service")}
    headless = services[workers["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    # Only the frontend is behind the ClusterIP Service.
    public = services["vllm-sr"]["spec"]
    assert public["type"] == "ClusterIP"
    assert public["selector"]["app.kubernetes.io/component"] == "frontend"
    cms = {o["metadata"]["name"]: o for o in by_kind(objs, "ConfigMap")}
    front_cfg = parse_config(cms["vllm-sr-config"]["data"]["config.yaml"])
    reps = front_cfg.deployments["primary"].effective_replicas()
    assert [(r.endpoint, r.model) for r in reps] == [
        (f"http://vllm-sr-workers-{i}.vllm-sr-workers.ml.svc:8080", "primary") for i in range(3)
    ]
    worker_cfg = parse_config(cms["vllm-sr-workers-config"]["data"]["config.yaml"])
    assert [r.device for r in worker_cfg.deployments["primary"].effective_replicas()] == [
        "cuda:0", "cuda:1"
    ]  # fmt: skip
    assert len(by_kind(objs, "PodDisruptionBudget")) == 2


def test_refuses_host_ids_naming_the_replica() -> None:
    with pytest.raises(PlacementError) as err:
        render(config_yaml("rocm:3", "rocm:5"), "c", RenderOptions())
    msg = err.value.message
    assert "replica primary-0: device rocm:3 cannot be an allocation ordinal" in msg
    assert "replica primary-1: device rocm:5" in msg and "this config uses 3, 5" in msg
    assert err.value.exit_code == EXIT_DO_NOT_RESTART
    # A gap is a host ID too: two GPUs are 0 and 1.
    with pytest.raises(PlacementError, match=r"replica primary-1: device cuda:2"):
        render(config_yaml("cuda:0", "cuda:2"), "c", RenderOptions())


def test_refuses_two_gpu_platforms_in_one_pod() -> None:
    text = config_yaml(
        "rocm:0",
        extra=textwrap.indent(
            textwrap.dedent(
                """\
                second:
                  device: cuda:0
                """
            ),
            "      ",
        ),
    )
    with pytest.raises(PlacementError, match=r"replica second-0: device cuda:0 is cuda while "
                       r"replica primary-0 is rocm"):  # fmt: skip
        render(text, "c", RenderOptions())
    # A CPU deployment beside one GPU platform is fine.
    mixed = config_yaml("rocm:0", extra=textwrap.indent("second:\n  device: cpu\n", "      "))
    limits = container_of(by_kind(validated(mixed), "StatefulSet")[0])["resources"]["limits"]
    assert limits == {"cpu": str(1 + 2 + 1), "amd.com/gpu": "1"}


def test_frontend_pods_refuse_attached_replicas_and_bad_names() -> None:
    text = textwrap.dedent(
        """\
        global:
          model_catalog:
            deployments:
              primary:
                endpoint: http://10.0.0.7:8100
                model: primary
        """
    )
    validated(text)  # an attached replica alone is fine in a pod
    with pytest.raises(PlacementError, match=r"replica primary-0: endpoint http://10.0.0.7:8100"):
        render(text, "c", RenderOptions(frontend_pods=2))
    with pytest.raises(UsageError, match=r"--name 'Vllm_SR'"):
        render(text, "c", RenderOptions(name="Vllm_SR"))
    with pytest.raises(UsageError, match=r"--frontend-pods 0"):
        render(text, "c", RenderOptions(frontend_pods=0))


def test_validator_catches_unknown_and_missing_fields() -> None:
    """The check above can fail: a misspelt field and a missing required one are caught."""
    sts = by_kind(render(config_yaml("cpu"), "c", RenderOptions()), "StatefulSet")[0]
    sts["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    assert openapi_problems(sts) and "livenessprobe" in openapi_problems(sts)[0]
    del sts["spec"]["template"]["spec"]["containers"][0]["livenessprobe"]
    del sts["spec"]["template"]["spec"]["containers"][0]["name"]
    assert openapi_problems(sts)


def test_cli_writes_a_directory_and_exits_78_on_a_refusal(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(config_yaml("cpu"))
    out = tmp_path / "manifests"
    run = [sys.executable, "-m", "vllm_sr.cli", "render", "kubernetes", "--config", str(cfg)]
    proc = subprocess.run([*run, "--out", str(out)], capture_output=True, text=True, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "00-configmap-vllm-sr-config.yaml",
        "01-service-vllm-sr-pods.yaml",
        "02-service-vllm-sr.yaml",
        "03-statefulset-vllm-sr.yaml",
        "04-poddisruptionbudget-vllm-sr.yaml",
    ]
    assert proc.stdout.split() == [str(out / n) for n in names]
    (out / "99-old.yaml").write_text("kind: Secret\n")
    with pytest.raises(UsageError, match=r"99-old\.yaml"):
        write_dir(render(cfg.read_text(), "c", RenderOptions()), out)
    cfg.write_text(config_yaml("rocm:4"))
    proc = subprocess.run(run, capture_output=True, text=True, cwd=REPO_ROOT)
    assert proc.returncode == EXIT_DO_NOT_RESTART
    assert "replica primary-0: device rocm:4 cannot be an allocation ordinal" in proc.stderr
    assert proc.stdout == ""
