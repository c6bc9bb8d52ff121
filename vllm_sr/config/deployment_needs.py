"""What in a Router-mode config asks a deployment (a model worker) to answer it, so that a
config whose routing needs none runs with no worker (issue 39): no embedded d3-edge when
``global.model_catalog`` is omitted, and ``deployments: {}`` accepted.

A signal needs a deployment when its family's row in ``signal_registry`` says so: a
``deployment`` family (embeddings, domains, the embedding-only families of ``signal_embedded``),
or an entry naming ``deployment:`` in a family that takes one (pii's token classifier); the
``cpu_step`` and ``loop`` families (keywords, context, structure, conversation, language,
metadata, role_bindings, pii without ``deployment:``) are evaluated in the frontend. Two decision
plugins embed too: ``response_cache`` with a semantic tier and ``tool_selection``. Works on the
raw mapping (wrong types are tolerated: field validation reports those), top-level routing and
every recipe's.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_sr.config.routing_base import Path, as_dict, as_list
from vllm_sr.config.routing_plugins import canonical_type
from vllm_sr.config.signal_registry import BY_CONFIG_KEY, entry_asks_deployment
from vllm_sr.jsontypes import JsonObject


@dataclass(frozen=True)
class Need:
    """One thing that asks a deployment: where it is in the file and what it is."""

    path: Path
    what: str  # "signal 'billing' (embeddings)"


def router_mode(raw: JsonObject) -> bool:
    """The file serves routed chats: ``providers`` present and ``global.router.enabled`` not
    false (Engine mode, ``-e``, writes false)."""
    router = as_dict(as_dict(raw.get("global")).get("router"))
    return raw.get("providers") is not None and router.get("enabled") is not False


def deployment_needs(raw: JsonObject) -> list[Need]:
    """Every signal and decision plugin, in the top-level routing and each recipe's, that a
    deployment answers, in file order."""
    needs = _routing_needs(raw.get("routing"), ("routing",))
    for i, recipe in enumerate(as_list(raw.get("recipes"))):
        needs += _routing_needs(as_dict(recipe).get("routing"), ("recipes", i, "routing"))
    return needs


def _routing_needs(routing: object, base: Path) -> list[Need]:
    rt = as_dict(routing)
    signals = as_dict(rt.get("signals"))
    needs = []
    for family, row in BY_CONFIG_KEY.items():
        if not row.supported:
            continue
        for i, sig in enumerate(as_list(signals.get(family))):
            sig = as_dict(sig)
            if not entry_asks_deployment(row, sig.get("deployment")):
                continue  # evaluated in the frontend
            needs.append(Need((*base, "signals", family, i), f"signal {_name(sig)} ({family})"))
    for i, dec in enumerate(as_list(rt.get("decisions"))):
        dec = as_dict(dec)
        for k, plugin in enumerate(as_list(dec.get("plugins"))):
            plugin = as_dict(plugin)
            kind = canonical_type(plugin.get("type"))
            conf = as_dict(plugin.get("configuration"))
            if conf.get("enabled") is not True:
                continue
            if kind == "response_cache" and conf.get("mode") != "exact":
                what = "response_cache plugin (its semantic tier embeds the query)"
            elif kind == "tool_selection":
                what = "tool_selection plugin (it embeds the tools and the query)"
            else:
                continue
            needs.append(
                Need((*base, "decisions", i, "plugins", k), f"{what} of decision {_name(dec)}")
            )
    return needs


def _name(entry: JsonObject) -> str:
    name = entry.get("name")
    return repr(name) if isinstance(name, str) else "(unnamed)"
