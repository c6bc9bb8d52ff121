"""The knowledge bases the ``kb`` signal reads: ``global.model_catalog.kbs`` plus upstream's
two defaults (``pkg/config/canonical_defaults.go``), ``privacy_kb`` and ``mmlu_kb``, with
their example sets shipped in ``vllm_sr/config/kbs/`` (see its README). A declared entry of
the same name replaces a default. And the rules a kb signal must satisfy: it names a known
knowledge base whose manifest can be read, and a label or group that base has."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_sr.config.problems import Problem
from vllm_sr.config.routing_base import Path as YamlPath
from vllm_sr.config.routing_base import as_dict, as_list, problem
from vllm_sr.config.upstream_catalog import KnowledgeBase

BUILTIN_DIR = Path(__file__).resolve().parent / "kbs"
MANIFEST = "labels.json"

_PRIVATE = [
    "prompt_injection",
    "credential_exfiltration",
    "jailbreak_role",
    "system_prompt_extraction",
]
_POLICY = [
    "proprietary_code",
    "internal_document",
    "pii",
    "business_strategy",
    "trade_secret_ip",
    "operational_infrastructure",
    "locality_directive",
    "customer_data",
]
_FRONTIER = ["architecture_analysis", "root_cause_analysis", "multi_step_tradeoffs"]
_LOCAL = ["generic_coding", "simple_task", "general_knowledge"]


def default_kbs() -> list[KnowledgeBase]:
    """Upstream's default knowledge bases, reading the manifests shipped with vllm-sr."""
    privacy = {
        "name": "privacy_kb",
        "source": {"path": str(BUILTIN_DIR / "privacy"), "manifest": MANIFEST},
        "threshold": 0.55,
        "label_thresholds": {"prompt_injection": 0.7},
        "groups": {
            "security_containment": _PRIVATE,
            "privacy_policy": _POLICY,
            "frontier_reasoning": _FRONTIER,
            "local_standard": _LOCAL,
            "private": _PRIVATE + _POLICY,
            "public": _FRONTIER + _LOCAL,
        },
        "metrics": [
            {"name": "private_vs_public", "type": "group_margin",
             "positive_group": "private", "negative_group": "public"},
        ],
    }  # fmt: skip
    mmlu = {
        "name": "mmlu_kb",
        "source": {"path": str(BUILTIN_DIR / "mmlu"), "manifest": MANIFEST},
        "threshold": 0.25,
        "groups": {
            "escalate": ["biology", "business", "computer science", "economics", "history",
                         "math", "other", "philosophy", "psychology"],
            "keep": ["chemistry", "engineering", "health", "law", "physics"],
        },
        "metrics": [
            {"name": "escalate_vs_keep", "type": "group_margin",
             "positive_group": "escalate", "negative_group": "keep"},
        ],
    }  # fmt: skip
    return [KnowledgeBase.model_validate(privacy), KnowledgeBase.model_validate(mmlu)]


def knowledge_bases(declared: list[object] | None) -> list[KnowledgeBase]:
    """The declared knowledge bases, then each default that none of them names."""
    out = [
        kb if isinstance(kb, KnowledgeBase) else KnowledgeBase.model_validate(kb)
        for kb in declared or []
    ]
    names = {kb.name for kb in out}
    return out + [kb for kb in default_kbs() if kb.name not in names]


def manifest_path(kb: KnowledgeBase) -> Path:
    """``source.path``/``source.manifest`` (labels.json). A relative path is taken from the
    working directory vllm-sr runs in; upstream's own ``knowledge_bases/mmlu/`` and
    ``knowledge_bases/privacy/`` (relative to upstream's config directory), when not found
    there, are the copies shipped with vllm-sr."""
    base = Path(kb.source.path).expanduser()
    path = base / (kb.source.manifest or MANIFEST)
    parts = base.parts
    if not base.is_absolute() and not path.exists() and parts[:1] == ("knowledge_bases",):
        shipped = BUILTIN_DIR.joinpath(*parts[1:]) / (kb.source.manifest or MANIFEST)
        if shipped.exists():
            return shipped
    return path


def manifest_labels(kb: KnowledgeBase) -> dict[str, list[str]]:
    """label -> exemplars. Raises ValueError naming the knowledge base and the file."""
    path = manifest_path(kb)
    try:
        labels = json.loads(path.read_text())["labels"]
        return {
            str(name): [str(t) for t in (entry.get("exemplars") or [])]
            for name, entry in labels.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"knowledge base {kb.name!r}: cannot read its manifest {path} ({exc}); accepted: a "
            'JSON file {"labels": {LABEL: {"exemplars": [TEXT, ...]}}}'
        ) from None


def kb_problems(routing: object, catalog: object, base: YamlPath = ("routing",)) -> list[Problem]:
    """Each kb signal names a knowledge base (declared or a default) whose manifest reads,
    and a label (target.kind label) or group (kind group) of it."""
    rules = as_list(as_dict(as_dict(routing).get("signals")).get("kb"))
    if not rules:
        return []
    try:
        kbs = {kb.name: kb for kb in knowledge_bases(as_list(as_dict(catalog).get("kbs")))}
    except ValueError:
        return []  # a malformed kbs entry: the field validation reports it
    problems: list[Problem] = []
    labels: dict[str, dict[str, list[str]] | str] = {}
    for i, rule in enumerate(rules):
        rule = as_dict(rule)
        path = (*base, "signals", "kb", i)
        name = rule.get("kb")
        if not isinstance(name, str):
            continue
        kb = kbs.get(name)
        if kb is None:
            problems.append(
                problem(
                    (*path, "kb"),
                    f"{name!r} names no knowledge base; accepted: one of {', '.join(sorted(kbs))} "
                    "(global.model_catalog.kbs, or upstream's defaults)",
                )
            )
            continue
        if name not in labels:
            try:
                labels[name] = manifest_labels(kb)
            except ValueError as exc:
                labels[name] = str(exc)
        known = labels[name]
        if isinstance(known, str):
            problems.append(problem((*path, "kb"), known))
            continue
        target = as_dict(rule.get("target"))
        kind, value = target.get("kind"), target.get("value")
        pool = sorted(known) if kind == "label" else sorted(kb.groups or {})
        if isinstance(value, str) and kind in ("label", "group") and value not in pool:
            problems.append(
                problem(
                    (*path, "target", "value"),
                    f"{value!r} is not a {kind} of knowledge base {name!r}; accepted: one of "
                    f"{', '.join(pool) or '(none)'}",
                )
            )
    return problems
