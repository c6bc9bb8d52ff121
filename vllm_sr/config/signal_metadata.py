"""pydantic models of the signal families that read who sent a request and what it says about
itself rather than its text: ``metadata`` (the request's caller-provided ``metadata`` object)
and ``role_bindings`` (the authz signal, over the identity headers).

Field names, defaults and load-time rules are upstream's (``metadata_signal.go``,
``validator_metadata.go``; role bindings as ``classification/authz_classifier.go`` checks
them). The text-reading families are in ``signal_families``; the evaluation lives in
``vllm_sr.router.deterministic``.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from vllm_sr.config.routing_base import Strict

# -- metadata -------------------------------------------------------------------------------


class MetadataPredicate(Strict):
    """Exactly one comparator."""

    equals: str | None = None
    """The key is present with exactly this value."""

    in_: list[str] | None = Field(default=None, alias="in")
    """The key is present with one of these values."""

    exists: bool | None = None
    """true: the key is present; false: it is absent."""

    @model_validator(mode="after")
    def _exactly_one(self) -> MetadataPredicate:
        set_ = [self.equals is not None, bool(self.in_), self.exists is not None]
        if sum(set_) != 1:
            raise ValueError("predicate must set exactly one of equals, in (non-empty), exists")
        return self

    def holds(self, metadata: dict[str, str], key: str) -> bool:
        present = key in metadata
        if self.exists is not None:
            return present == self.exists
        if not present:
            return False
        if self.equals is not None:
            return metadata[key] == self.equals
        return metadata[key] in (self.in_ or [])


class MetadataSignal(Strict):
    """Matches on the request's ``metadata`` object (caller-provided, untrusted: never an
    identity)."""

    name: str = Field(min_length=1, max_length=128)
    """The rule's name (no surrounding spaces; unique ignoring case); decisions name it as
    {type: metadata, name: NAME}."""

    description: str | None = Field(default=None, max_length=2000)
    """Free text for people."""

    key: str = Field(min_length=1, max_length=128)
    """The metadata key read (no surrounding spaces)."""

    predicate: MetadataPredicate
    """What the key's value must be: equals, in or exists."""

    @field_validator("name", "key")
    @classmethod
    def _no_surrounding_space(cls, value: str) -> str:
        if value.strip() == "":
            raise ValueError("must not be blank")
        if value.strip() != value:
            raise ValueError(f"{value!r} must not have surrounding whitespace")
        return value


# -- role bindings (the authz signal) -------------------------------------------------------


class Subject(Strict):
    kind: str
    """User (matches the user-id header) or Group (matches an entry of the groups header);
    case and surrounding space ignored."""

    name: str = Field(min_length=1, max_length=256)
    """The user id or group name, compared exactly (surrounding space ignored)."""

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        kind = value.strip().lower()
        if kind not in ("user", "group"):
            raise ValueError(f"kind {value!r} must be User or Group")
        return "User" if kind == "user" else "Group"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value.strip() == "":
            raise ValueError(
                "name must not be blank: it must equal what your auth backend sends in the "
                "identity headers"
            )
        return value.strip()


class RoleBinding(Strict):
    """Grants ``role`` (the authz signal's name) to the listed users and groups."""

    name: str = Field(min_length=1, max_length=128)
    """The binding's name (unique; for logs)."""

    description: str | None = Field(default=None, max_length=2000)
    """Free text for people."""

    role: str = Field(min_length=1, max_length=128)
    """The role granted; decisions name it as {type: authz, name: ROLE}."""

    subjects: list[Subject] = Field(min_length=1, max_length=1024)
    """Who holds the role: any subject matching is enough."""
