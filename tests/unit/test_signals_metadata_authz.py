"""The metadata signal (upstream's ``metadata/routing-hints.yaml``) with the request metadata
limits, and role bindings (upstream's ``authz/rbac.yaml``) with the identity headers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from vllm_sr.config.routing_signals import Signals
from vllm_sr.config.signal_metadata import MetadataSignal, RoleBinding
from vllm_sr.errors import InvalidRequest
from vllm_sr.router.deterministic import AuthzRequired, DeterministicSignals
from vllm_sr.router.request_view import RequestView

FRAGMENTS = Path(__file__).parents[1] / "fixtures" / "upstream" / "fragments" / "signal"


def fragment(path: str) -> Signals:
    """An upstream fragment's ``routing.signals``, loaded unchanged."""
    doc = yaml.safe_load((FRAGMENTS / path).read_text())
    return Signals.model_validate(doc["routing"]["signals"])


# -- metadata -------------------------------------------------------------------------------


def hints() -> DeterministicSignals:
    return DeterministicSignals(fragment("metadata/routing-hints.yaml"))


def chat(metadata: Any = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    if metadata is not None:
        body["metadata"] = metadata
    return {**body, **extra}


def test_routing_hints_fragment_matches_the_exact_value() -> None:
    key = ("metadata", "consent-denied")
    res = hints().evaluate(RequestView.from_chat(chat({"consent": "denied"}), {}))[key]
    assert (res.matched, res.confidence, res.value) == (True, 1.0, None)
    for meta in ({"consent": "Denied"}, {"consent": "granted"}, {}, None):
        assert not hints().evaluate(RequestView.from_chat(chat(meta), {}))[key].matched


def meta_rule(**predicate: Any) -> DeterministicSignals:
    rule = MetadataSignal.model_validate({"name": "m", "key": "tier", "predicate": predicate})
    return DeterministicSignals(Signals(metadata=[rule]))


@pytest.mark.parametrize(
    ("predicate", "metadata", "matched"),
    [
        ({"in": ["gold", "silver"]}, {"tier": "silver"}, True),
        ({"in": ["gold", "silver"]}, {"tier": "bronze"}, False),
        ({"in": ["gold"]}, {}, False),
        ({"exists": True}, {"tier": ""}, True),
        ({"exists": True}, {}, False),
        ({"exists": False}, {}, True),
        ({"exists": False}, {"tier": "x"}, False),
        ({"equals": ""}, {"tier": ""}, True),
    ],
)
def test_metadata_predicates(
    predicate: dict[str, Any], metadata: dict[str, str], matched: bool
) -> None:
    view = RequestView.from_chat(chat(metadata), {})
    assert meta_rule(**predicate).evaluate(view)[("metadata", "m")].matched is matched


@pytest.mark.parametrize(
    "predicate", [{}, {"equals": "a", "exists": True}, {"in": []}, {"in": ["a"], "equals": "b"}]
)
def test_metadata_predicate_needs_exactly_one_comparator(predicate: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="exactly one of equals, in"):
        MetadataSignal.model_validate({"name": "m", "key": "k", "predicate": predicate})


@pytest.mark.parametrize(("field", "value"), [("name", " m"), ("key", "k "), ("key", "  ")])
def test_metadata_names_and_keys_have_no_surrounding_space(field: str, value: str) -> None:
    doc = {"name": "m", "key": "k", "predicate": {"exists": True}, field: value}
    with pytest.raises(ValidationError):
        MetadataSignal.model_validate(doc)


@pytest.mark.parametrize(
    ("metadata", "field", "message"),
    [
        ({"k": 1}, "metadata.k", "must be a string"),
        ({"k": None}, "metadata.k", "must be a string"),
        ("text", "metadata", "must be an object"),
        (["a"], "metadata", "must be an object"),
        ({f"k{i}": "v" for i in range(33)}, "metadata", "more than 32 entries"),
        ({"": "v"}, "metadata", "between 1 and 128 bytes"),
        ({"k" * 129: "v"}, "metadata", "between 1 and 128 bytes"),
        ({"k": "v" * 1025}, "metadata.k", "exceeds 1024 bytes"),
    ],
)
def test_request_metadata_limits_are_400s_naming_the_field(
    metadata: Any, field: str, message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message) as err:
        RequestView.from_chat(chat(metadata), {})
    assert err.value.http_status == 400
    assert err.value.details["field"] == field


def test_request_metadata_at_the_limits_is_accepted() -> None:
    meta = {f"k{i}": "v" for i in range(31)} | {"k" * 128: "é" * 512}  # 1024 bytes
    assert len(RequestView.from_chat(chat(meta), {}).metadata) == 32
    # A null metadata is refused as upstream does (it is not an object).
    with pytest.raises(InvalidRequest, match="got null"):
        RequestView.from_chat({"messages": [], "metadata": None}, {})


# -- role bindings --------------------------------------------------------------------------


def rbac(
    fail_open: bool = False,
    user_id_header: str = "x-authz-user-id",
    user_groups_header: str = "x-authz-user-groups",
) -> DeterministicSignals:
    return DeterministicSignals(
        fragment("authz/rbac.yaml"),
        fail_open=fail_open,
        user_id_header=user_id_header,
        user_groups_header=user_groups_header,
    )


def roles(sigs: DeterministicSignals, headers: dict[str, str], **kw: Any) -> set[str]:
    out = sigs.evaluate(RequestView.from_chat(chat(), headers), **kw)
    return {name for (kind, name), r in out.items() if kind == "authz" and r.matched}


def test_rbac_fragment_grants_roles_by_group() -> None:
    sigs = rbac()
    assert roles(sigs, {"X-Authz-User-Id": "ann", "x-authz-user-groups": "platform-admins"}) == {
        "admin"
    }
    both = {"x-authz-user-id": "bob", "x-authz-user-groups": " premium-tier , platform-admins,"}
    assert roles(sigs, both) == {"admin", "premium_user"}
    assert roles(sigs, {"x-authz-user-id": "eve", "x-authz-user-groups": "Premium-Tier"}) == set()
    out = sigs.evaluate(RequestView.from_chat(chat(), {"x-authz-user-id": "eve"}))
    assert set(out) == {("authz", "admin"), ("authz", "premium_user")}


def test_a_user_subject_matches_the_user_id_exactly() -> None:
    binding = RoleBinding.model_validate(
        {"name": "b", "role": "ops", "subjects": [{"kind": "user", "name": " alice "}]}
    )
    sigs = DeterministicSignals(Signals(role_bindings=[binding]))
    assert roles(sigs, {"x-authz-user-id": "alice"}) == {"ops"}
    assert roles(sigs, {"x-authz-user-id": "Alice"}) == set()


def test_missing_identity_is_a_403_unless_fail_open() -> None:
    with pytest.raises(AuthzRequired) as err:
        roles(rbac(), {"x-authz-user-groups": "platform-admins"})
    assert (err.value.http_status, err.value.code) == (403, "authz_required")
    assert roles(rbac(fail_open=True), {"x-authz-user-groups": "platform-admins"}) == set()
    # Eval skips authz; and a request whose decisions name no authz leaf never asks.
    assert roles(rbac(), {}, authz=False) == set()
    assert roles(rbac(), {}, wanted={("context", "x")}) == set()


def test_custom_identity_headers() -> None:
    sigs = rbac(user_id_header="X-User", user_groups_header="X-Groups")
    assert roles(sigs, {"x-user": "u", "x-groups": "premium-tier"}) == {"premium_user"}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"role": "r", "subjects": []}, "at least 1 item"),
        ({"role": "r", "subjects": [{"kind": "Team", "name": "x"}]}, "must be User or Group"),
        ({"role": "r", "subjects": [{"kind": "User", "name": "  "}]}, "must not be blank"),
        ({"role": "", "subjects": [{"kind": "User", "name": "a"}]}, "at least 1 character"),
    ],
)
def test_role_binding_load_rules(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RoleBinding.model_validate({"name": "b", **doc})
