"""Whether each deployment's artifact can load on this host, checked the way its workers will
resolve it, so `config validate`, `config apply` and `serve` refuse it before anything starts
instead of every replica failing at start (exit 78 either way, but with the YAML line and the
places looked in, once, rather than a restart loop's last error per replica)."""

from __future__ import annotations

from pathlib import Path

from vllm_sr.config.files import parse_document, render_problem
from vllm_sr.config.problems import Problem
from vllm_sr.config.schema import RootConfig
from vllm_sr.errors import ArtifactError, ConfigError


def artifact_problems(config: RootConfig, artifacts_dir: Path) -> list[Problem]:
    """One problem per deployment with a managed worker whose artifact does not resolve here.
    Deployments whose replicas are all attached (endpoint) load nothing on this host."""
    # The worker's own resolution, so the check and the worker cannot disagree; imported here
    # because the worker module brings numpy, which only this check needs.
    from vllm_sr.worker.artifacts import resolve

    problems = []
    for name, dep in config.deployments.items():
        if all(r.endpoint is not None for r in dep.effective_replicas()):
            continue
        try:
            resolve(dep.artifact, artifacts_dir)
        except ArtifactError as exc:
            path = ("global", "model_catalog", "deployments", name, "artifact")
            problems.append(Problem(path, f"deployment {name!r} cannot load here: {exc.message}"))
    return problems


def check_artifacts(config: RootConfig, text: str, source: str, artifacts_dir: Path) -> None:
    """Raise ConfigError (exit 78) listing, with file and line, every artifact that cannot load."""
    problems = artifact_problems(config, artifacts_dir)
    if not problems:
        return
    doc = parse_document(text, source)
    rendered = [render_problem(source, doc, p) for p in problems]
    # The message carries the problems too: a refused reload's reload_failed reason is it.
    raise ConfigError("; ".join(rendered), rendered)
