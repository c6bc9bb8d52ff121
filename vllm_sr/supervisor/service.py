"""The running service: supervisor + frontend + control API in one asyncio process, and the
bridge from config.yaml (loaded and planned by the config and placement packages) to the
supervisor's ``ServicePlan`` (``vllm_sr.plan``)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_sr.config.schema import DEFAULT_ARTIFACT, RootConfig
from vllm_sr.events import log_sink
from vllm_sr.frontend.app import Frontend
from vllm_sr.frontend.chat_mount import ChatMount
from vllm_sr.jsontypes import JsonObject
from vllm_sr.plan import AuthzOptions, DeploymentPlan, ReplicaSpec, RouterPlan, ServicePlan
from vllm_sr.pool.directory import PoolDirectory
from vllm_sr.pool.settings import PoolSettings
from vllm_sr.supervisor.config_source import ConfigSource
from vllm_sr.supervisor.config_watch import ConfigWatch
from vllm_sr.supervisor.managed import ProcessOptions
from vllm_sr.supervisor.reconfigure import Planner, Scaler
from vllm_sr.supervisor.supervisor import Supervisor
from vllm_sr.supervisor.systemd import SystemdNotifier

if TYPE_CHECKING:
    from vllm_sr.config.service import ServiceSettings

log = logging.getLogger("vllm_sr.serve")

Announce = Callable[[str, str, ServicePlan], None]  # frontend, control socket, plan


@dataclass
class ServeOptions:
    settings: ServiceSettings
    announce: Announce | None = None
    worker_argv: list[str] | None = None
    config_source: ConfigSource | None = None  # config.yaml's hashes (None: no file to watch)


def service_plan(config: RootConfig, replicas: list[ReplicaSpec]) -> ServicePlan:
    """config.yaml (a validated RootConfig) + the planner's replica specs -> ServicePlan."""
    from vllm_sr.config.files import effective_dict

    deployments = {
        name: DeploymentPlan(
            name=name,
            artifact=dep.artifact,
            replicas=[spec for spec in replicas if spec.deployment == name],
            settings=PoolSettings.from_deployment(dep),
            public_name=dep.public_name,
        )
        for name, dep in config.deployments.items()
    }
    router = RouterPlan(
        enabled=config.global_.router.enabled,
        auto_model_names=tuple(config.global_.router.auto_model_names),
        providers=config.providers,
        routing=config.recipes_by_name()["default"],
        recipes=config.recipes_by_name(),
        entrypoints={
            name.strip(): config.recipe_name_for(name) or "default"
            for entry in config.entrypoints
            for name in entry.model_names
        },
        decision_deployment=config.default_deployment(),
        authz=authz_options(config),
        global_=config.global_,
    )
    return ServicePlan(
        deployments,
        config.default_deployment(),
        effective_dict(config),
        router,
        listen=first_listener(config),
        embedded_default=DEFAULT_ARTIFACT if config.uses_embedded_default else None,
    )


def first_listener(config: RootConfig) -> str | None:
    """``listeners[0]`` as HOST:PORT (IPv6 in brackets), or None when there is none."""
    address = config.listen_address()
    if address is None:
        return None
    host, port = address
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def authz_options(config: RootConfig) -> AuthzOptions:
    """``global.services.authz``: the identity headers role_bindings read."""
    authz = config.global_.services.authz
    identity = authz.identity
    return AuthzOptions(
        user_id_header=identity.user_id_header.lower(),
        user_groups_header=identity.user_groups_header.lower(),
        fail_open=authz.fail_open,
    )


def config_planner(
    config_path: Path, artifacts_dir: Path | None = None, source: ConfigSource | None = None
) -> Planner:
    """Re-reads and re-plans config.yaml on every call (start, SIGHUP, scale, the watch). With
    ``artifacts_dir``, a reload naming an artifact that cannot load here is refused up front.
    ``source`` is told the hash of each text read and of each text planned."""
    from vllm_sr.config.files import parse_config, read_config_text
    from vllm_sr.config.watch import text_hash
    from vllm_sr.placement import planner
    from vllm_sr.placement.artifacts import check_artifacts

    def plan() -> ServicePlan:
        text, existed = read_config_text(config_path)
        digest = text_hash(text)
        if source is not None:
            source.read(digest, existed)
        config = parse_config(text, str(config_path))
        if artifacts_dir is not None:
            check_artifacts(config, text, str(config_path), artifacts_dir)
        planned = service_plan(config, list(planner.plan(config).replicas))
        if planned.router is not None:
            planned.router = dataclasses.replace(planned.router, config_hash=digest)
        if source is not None:
            source.planned(digest)
        return planned

    return plan


def _gpu_probe(platform: str) -> dict[str, JsonObject]:
    from vllm_sr.placement.gpus import gpu_usage

    return {str(k): dict(v) for k, v in gpu_usage(platform).items()}


def signal_process_count(setting: int | str) -> int:
    """``signal_processes`` (host settings): a number as is, ``auto`` from the CPU budget."""
    if isinstance(setting, int):
        return setting
    from vllm_sr.placement.cpu import measure_cpu_budget
    from vllm_sr.supervisor.signal_procs import auto_count

    return auto_count(measure_cpu_budget().cpus)


def config_scaler(config_path: Path) -> Scaler:
    from vllm_sr.placement import apply

    def scale(deployment: str, replicas: int) -> None:
        apply.apply_scale(config_path, deployment, replicas)

    return scale


async def serve(planner: Planner, options: ServeOptions, *, scaler: Scaler | None = None) -> int:
    """Run until stopped by a signal (or a stop command). Returns the exit code."""
    from vllm_sr.control.server import ControlServer

    settings = options.settings
    # Built first and handed to both: the pools' directory (the supervisor publishes into it,
    # the frontend resolves against it) and Router mode's chat mount (the frontend serves it,
    # the supervisor's inventory and replay read it).
    directory = PoolDirectory()
    chat = ChatMount(directory)
    sup = Supervisor(
        planner,
        runtime_dir=settings.runtime_dir,
        options=ProcessOptions(
            ready_timeout_s=settings.ready_timeout_s,
            stop_grace_s=settings.stop_grace_s,
            worker_argv=options.worker_argv,
        ),
        notifier=SystemdNotifier(),
        drain_timeout_s=settings.drain_timeout_s,
        router=chat,
        router_builder=chat,
        directory=directory,
        scaler=scaler,
        gpu_probe=_gpu_probe,
        config_source=options.config_source,
        signal_processes=signal_process_count(settings.signal_processes),
    )
    sup.events.add_sink(log_sink())
    sup.install_signal_handlers()  # before anything starts: a SIGTERM while loading stops
    frontend = Frontend(sup, max_connections=settings.max_connections, chat=chat)
    control = ControlServer(
        sup, settings.control_socket, group=settings.control_group, admin_group=settings.admin_group
    )
    try:
        await sup.start()
        host, port = settings.listen_host_port()
        address = await frontend.start(host, port)
        await control.start()
        assert sup.plan is not None
        if options.announce is not None:
            options.announce(address, str(settings.control_socket), sup.plan)
        log.info("frontend on http://%s, control API on %s", address, settings.control_socket)
        source = options.config_source
        if source is not None and source.watching:
            watch = ConfigWatch(
                source.path, source, sup.submit, settle_s=settings.config_watch_settle_s
            )
            sup.keep_task("config_watch", watch.run)
            log.info("watching %s for changes", source.path)
        await sup.run()
    finally:
        await control.stop()
        await frontend.stop()
        sup.shutdown.kill_all_now()  # only reached with workers alive after an error
    return 0
