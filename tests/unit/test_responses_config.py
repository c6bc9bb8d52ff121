"""``global.services.response_api`` as upstream writes it: the agent recipe's block loads (no
refusal left for it), a written block without ``enabled`` is on (upstream's default), an
omitted block is off, and the store settings come through typed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import yaml

from vllm_sr.config.files import parse_config
from vllm_sr.errors import ConfigError
from vllm_sr.frontend.chat_mount import _responses_of
from vllm_sr.plan import RouterPlan

RECIPES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "recipes"
BASE = """\
providers:
  defaults: {default_model: small}
  models:
    - name: small
      backend_refs: [{endpoint: 127.0.0.1:8000}]
"""


def services(snippet: str) -> str:
    return BASE + "global:\n  services:\n" + textwrap.indent(snippet, "    ")


def plan_of(text: str) -> RouterPlan:
    config = parse_config(text)
    return RouterPlan(True, ("vllm-sr/auto",), None, None, "primary", global_=config.global_)


def test_the_agent_recipes_block_is_not_refused() -> None:
    path = RECIPES / "agent" / "config.yaml"
    try:
        parse_config(path.read_text(), str(path))
        problems: list[str] = []
    except ConfigError as exc:
        problems = list(exc.problems)
    # (Router Learning and router_replay's postgres store are acted on too: nothing is refused)
    assert not [p for p in problems if "response_api" in p], problems


def test_written_without_enabled_it_is_on_and_omitted_it_is_off() -> None:
    on = _responses_of(plan_of(services("response_api: {store_backend: memory}\n")))
    assert on is not None and on.enabled and on.backend() == "memory"
    assert on.ttl_seconds == 86400 and on.max_responses == 1000  # upstream's defaults
    assert _responses_of(plan_of(BASE)) is None
    off = services("response_api: {enabled: false, store_backend: memory}\n")
    assert _responses_of(plan_of(off)) is None


def test_redis_settings_are_typed() -> None:
    conf = _responses_of(
        plan_of(
            services(
                "response_api:\n  store_backend: redis\n  ttl_seconds: 60\n"
                "  redis: {address: 'redis:6379', db: 2, key_prefix: 'vsr', pool_size: 4}\n"
            )
        )
    )
    assert conf is not None and conf.backend() == "redis"
    assert conf.redis.address == "redis:6379" and conf.redis.db == 2
    assert conf.redis.key_prefix == "vsr" and conf.redis.pool_size == 4
    assert conf.ttl_seconds == 60


async def test_the_redis_client_follows_upstreams_defaults() -> None:
    from vllm_sr.config.upstream_global import ResponseAPIRedis
    from vllm_sr.router.responses.redis_store import redis_client

    client, prefix = redis_client(ResponseAPIRedis(address="db.local:6380", key_prefix="vsr"))
    kwargs = client.connection_pool.connection_kwargs
    assert prefix == "vsr:"  # a ':' is added, as upstream
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("db.local", 6380, 0)
    assert kwargs["socket_connect_timeout"] == 5 and kwargs["socket_timeout"] == 3
    await client.aclose()
    unix = ResponseAPIRedis(address="unix:///run/r.sock", read_timeout=-1)
    client, prefix = redis_client(unix)
    kwargs = client.connection_pool.connection_kwargs
    assert prefix == "sr:" and kwargs["path"] == "/run/r.sock"
    assert kwargs["socket_timeout"] is None  # -1: no limit
    await client.aclose()


async def test_upstreams_default_store_is_redis_on_this_host() -> None:
    """multi-objective's block (store_backend: redis, no redis block) loads and its store talks
    to localhost:6379, where upstream's ``vllm-sr serve`` fills in the Redis it starts."""
    from vllm_sr.router.responses.redis_store import redis_client

    doc = yaml.safe_load((RECIPES / "multi-objective" / "config.yaml").read_text())
    doc["global"]["integrations"]["looper"]["endpoint"] = ""  # its loopers are another issue
    block = parse_config(yaml.safe_dump(doc))  # raised while the store was refused
    conf = _responses_of(plan_of(services("response_api: {enabled: true, store_backend: redis}\n")))
    assert conf is not None and conf.backend() == "redis"
    written = block.global_.services.response_api
    assert written is not None and written.backend() == "redis"
    for settings in (conf.redis, written.redis):
        client, prefix = redis_client(settings)
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["host"], kwargs["port"], prefix) == ("localhost", 6379, "sr:")
        await client.aclose()


async def test_a_reload_keeps_the_store_while_its_settings_stay() -> None:
    from vllm_sr.config.routing import Routing
    from vllm_sr.config.routing_providers import Providers
    from vllm_sr.frontend.chat_mount import ChatMount
    from vllm_sr.pool.directory import PoolDirectory

    providers = Providers.model_validate(
        {"defaults": {"default_model": "small"},
         "models": [{"name": "small", "backend_refs": [{"endpoint": "127.0.0.1:9"}]}]}
    )  # fmt: skip
    memory = "response_api: {store_backend: memory, ttl_seconds: 60}\n"

    def plan(snippet: str, routing: Routing) -> RouterPlan:
        glob = parse_config(services(snippet)).global_
        return RouterPlan(True, ("vllm-sr/auto",), providers, routing, "primary", global_=glob)

    mount = ChatMount(PoolDirectory())
    try:
        await mount.update(plan(memory, Routing()))
        first = mount.responses
        assert first is not None
        await first.store.put({"id": "resp_kept"})
        keywords = {"keywords": [{"name": "k", "operator": "OR", "keywords": ["k"]}]}
        await mount.update(plan(memory, Routing.model_validate({"signals": keywords})))
        assert mount.responses is first and await first.store.get("resp_kept") is not None
        await mount.update(plan(memory.replace("60", "61"), Routing()))
        assert mount.responses is not first and mount.responses is not None
        assert await mount.responses.store.get("resp_kept") is None
        assert first.store.usage() == 0  # the old store was closed
        await mount.update(plan("response_api: {enabled: false}\n", Routing()))
        assert mount.responses is None
    finally:
        await mount.close()
