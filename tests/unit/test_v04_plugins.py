"""v0.4's ``masking`` and ``shadow_dispatch`` plugins: their configuration (upstream's field
names, bounds and refusals) and masking's text rewriting (spans, merging, placeholders)."""

from __future__ import annotations

import pytest

from vllm_sr.config.plugin_request import MaskingPlugin
from vllm_sr.config.plugin_shadow import ShadowDispatchPlugin
from vllm_sr.config.routing_plugins import decision_plugins, plugin_problems
from vllm_sr.config.schema import semantic_problems
from vllm_sr.router.plugins.masking import Allocator, mask_body, mask_text, merge_spans
from vllm_sr.router.signals_pii import Entity


def problems_of(kind: str, conf: object) -> list[str]:
    return [
        p.message for p in plugin_problems(("routing", "decisions", 0, "plugins", 0), kind, conf)
    ]


def test_masking_config_fields_and_template_rule() -> None:
    conf = MaskingPlugin.model_validate(
        {"enabled": True, "threshold": 0.5, "entity_types": ["EMAIL_ADDRESS"],
         "placeholders": {"EMAIL_ADDRESS": "<mail {index}>"}}
    )  # fmt: skip
    assert conf.template("EMAIL_ADDRESS") == "<mail {index}>"
    assert conf.template("PHONE_NUMBER") == "[PHONE_NUMBER_{index}]"
    bad = problems_of("masking", {"enabled": True, "placeholders": {"US_SSN": "[SSN]"}})
    assert len(bad) == 1 and "{index}" in bad[0] and "'[SSN]'" in bad[0]
    assert problems_of("masking", {"enabled": True, "fail_open": True})  # strict: no such field


def test_shadow_dispatch_config_as_upstream_validates_it() -> None:
    ok = ShadowDispatchPlugin.model_validate({"enabled": True, "model": "b"})
    assert (ok.max_concurrency, ok.max_queue_depth, ok.timeout_seconds, ok.max_retries) == (
        2, 8, 30, 0)  # fmt: skip
    assert problems_of("shadow_dispatch", {"model": "b"})  # enabled is required
    assert any("model is required" in m for m in problems_of("shadow_dispatch", {"enabled": True}))
    assert problems_of("shadow_dispatch", {"enabled": True, "model": "b", "max_retries": 4})
    cred = problems_of(
        "shadow_dispatch", {"enabled": True, "model": "b", "forward_headers": ["Authorization"]}
    )
    assert len(cred) == 1 and "credential header" in cred[0] and "'Authorization'" in cred[0]
    tls = problems_of("shadow_dispatch", {"enabled": True, "model": "b", "tls_skip_verify": True})
    assert len(tls) == 1 and "not supported by vllm-sr" in tls[0]
    assert problems_of("shadow_dispatch", {"enabled": False}) == []


def _config(plugin: dict[str, object]) -> dict[str, object]:
    return {
        "version": "v0.3",
        "providers": {
            "defaults": {"model": "a"},
            "models": [
                {"name": "a", "backend_refs": [{"endpoint": "127.0.0.1:9"}]},
                {"name": "b", "backend_refs": [{"endpoint": "127.0.0.1:9"}]},
            ],
        },
        "routing": {
            "signals": {"keywords": [{"name": "k", "operator": "OR", "keywords": ["x"]}]},
            "decisions": [
                {"name": "d", "priority": 1,
                 "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "k"}]},
                 "modelRefs": [{"model": "a"}], "plugins": [plugin]},
            ],
        },
    }  # fmt: skip


def test_a_config_with_both_plugins_loads_and_an_unknown_shadow_model_is_named() -> None:
    good = _config({"type": "shadow_dispatch", "configuration": {"enabled": True, "model": "b"}})
    assert semantic_problems(good) == []
    masked = _config({"type": "masking", "configuration": {"enabled": True}})
    assert semantic_problems(masked) == []
    typed = decision_plugins(masked["routing"]["decisions"][0]["plugins"])  # type: ignore[index]
    assert typed.masking is not None and typed.masking.enabled
    bad = _config({"type": "shadow_dispatch", "configuration": {"enabled": True, "model": "zz"}})
    found = semantic_problems(bad)
    assert len(found) == 1
    assert (
        found[0].path[-1] == "model" and "'zz'" in found[0].message and "a, b" in found[0].message
    )


def span(kind: str, start: int, end: int, score: float = 1.0) -> Entity:
    return Entity(kind, start, end, score)


def test_one_value_one_placeholder_indexes_count_per_type_from_zero() -> None:
    alloc = Allocator.for_request(MaskingPlugin(enabled=True))
    text = "a@b.io, c@d.io, a@b.io"
    spans = [
        span("EMAIL_ADDRESS", 0, 6),
        span("EMAIL_ADDRESS", 8, 14),
        span("EMAIL_ADDRESS", 16, 22),
    ]
    assert (
        mask_text(text, spans, alloc) == "[EMAIL_ADDRESS_0], [EMAIL_ADDRESS_1], [EMAIL_ADDRESS_0]"
    )
    # the same allocator (one request) keeps counting in another text
    assert mask_text("c@d.io x@y.io", [span("EMAIL_ADDRESS", 0, 6), span("EMAIL_ADDRESS", 7, 13)],
                     alloc) == "[EMAIL_ADDRESS_1] [EMAIL_ADDRESS_2]"  # fmt: skip


def test_overlaps_merge_into_the_widest_and_filters_apply() -> None:
    merged = merge_spans([span("B", 3, 5), span("A", 0, 4), span("C", 10, 12)])
    assert [(s.type, s.start, s.end) for s in merged] == [("A", 0, 5), ("C", 10, 12)]
    conf = MaskingPlugin(enabled=True, threshold=0.5, entity_types=["PHONE_NUMBER"])
    alloc = Allocator.for_request(conf)
    text = "call 555 or mail m@x.io"
    spans = [
        span("PHONE_NUMBER", 5, 8, 0.9),
        span("EMAIL_ADDRESS", 17, 23),
        span("PHONE_NUMBER", 0, 4, 0.1),
    ]
    assert mask_text(text, spans, alloc) == "call [PHONE_NUMBER_0] or mail m@x.io"
    with pytest.raises(ValueError, match="outside"):
        mask_text("abc", [span("X", 2, 9)], alloc)


def test_mask_body_masks_every_messages_text_and_leaves_the_rest() -> None:
    def scan(text: str) -> list[Entity]:
        at = text.find("555-0100")
        return [span("PHONE_NUMBER", at, at + 8)] if at >= 0 else []

    body: dict[str, object] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "operator 555-0100"},
            {"role": "user", "content": [{"type": "text", "text": "me: 555-0100"},
                                         {"type": "image_url", "image_url": {"url": "555-0100"}}]},
        ],
        "user": "555-0100",
    }  # fmt: skip
    out, count = mask_body(body, MaskingPlugin(enabled=True), scan)
    assert count == 1
    assert out["messages"][0]["content"] == "operator [PHONE_NUMBER_0]"  # type: ignore[index]
    parts = out["messages"][1]["content"]  # type: ignore[index]
    assert parts[0]["text"] == "me: [PHONE_NUMBER_0]"
    assert parts[1]["image_url"]["url"] == "555-0100"
    assert out["user"] == "555-0100"
    assert body["messages"][0]["content"] == "operator 555-0100"  # type: ignore[index]
