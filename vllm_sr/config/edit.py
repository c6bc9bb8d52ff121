"""Edits of the round-trip config document that touch as little as possible.

Pure data: these functions change a ruamel document in place (kept items and their comments
stay) and know nothing of GPUs or CPU budgets. ``vllm_sr.placement.apply`` decides *what* to
write (the flag edits); this module knows *how* to write it into the operator's file.
"""

from __future__ import annotations

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import CommentMark
from ruamel.yaml.tokens import CommentToken

from vllm_sr.config.deployment import Replica
from vllm_sr.config.schema import embedded_default_deployments

__all__ = ["child", "deployment_doc", "set_key", "set_threads", "write_replicas"]

# Where a new `replicas` key goes: after the last of these that the deployment has.
_REPLICAS_AFTER = ("provider", "artifact", "revision", "engine_args", "timeout_ms", "threads")
# Where a new `threads` key goes: after the last of these, else before replicas/device.
_THREADS_AFTER = ("provider", "artifact", "revision", "engine_args", "timeout_ms", "hang_after_ms")


def _replica_map(r: Replica) -> CommentedMap:
    m = CommentedMap()
    for key, value in (("device", r.device), ("endpoint", r.endpoint), ("model", r.model)):
        if value is not None:
            m[key] = value
    return m


def _same(item: object, r: Replica) -> bool:
    return isinstance(item, dict) and {k: v for k, v in item.items()} == dict(_replica_map(r))


def _last_comment(item: object) -> tuple[list[object], CommentToken] | None:
    """The comment entry of a mapping's last key and its end-of-line token (None: none)."""
    if not isinstance(item, CommentedMap) or not item:
        return None
    entry = item.ca.items.get(list(item.keys())[-1])
    if not entry or len(entry) < 3 or not isinstance(entry[2], CommentToken):
        return None
    return entry, entry[2]


def _take_trailer(item: object) -> str:
    """Split the comment block that follows ``item`` off its end-of-line comment."""
    found = _last_comment(item)
    if found is None:
        return ""
    entry, token = found
    head, _, rest = token.value.partition("\n")
    if head:
        token.value = head + "\n"
    else:
        entry[2] = None
    return rest


def _give_trailer(item: object, trailer: str) -> None:
    found = _last_comment(item)
    if found is not None:
        found[1].value = found[1].value.rstrip("\n") + "\n" + trailer
    elif isinstance(item, CommentedMap) and item:
        key = list(item.keys())[-1]
        token = CommentToken("\n" + trailer, CommentMark(0), None)
        entry = item.ca.items.setdefault(key, [None, None, None, None])
        entry[2] = token


def write_replicas(dep_doc: CommentedMap, replicas: list[Replica]) -> None:
    """Put the canonical ``replicas`` into one deployment's mapping, touching as little as
    possible: kept items (and their comments) stay, the tail is trimmed or extended."""
    if "replicas" in dep_doc and isinstance(dep_doc["replicas"], CommentedSeq):
        seq = dep_doc["replicas"]
        for i, r in enumerate(replicas[: len(seq)]):
            if _same(seq[i], r):
                continue
            target = _replica_map(r)
            if isinstance(seq[i], CommentedMap):
                for key in [k for k in seq[i] if k not in target]:
                    del seq[i][key]
                for key, value in target.items():
                    seq[i][key] = value
            else:
                seq[i] = target
        # Comment lines after the list belong, in ruamel's model, to its last item; carry them
        # over to whatever item is last after the resize so they stay where the operator put them.
        trailer = _take_trailer(seq[-1]) if len(seq) != len(replicas) else ""
        while len(seq) > len(replicas):
            del seq[len(seq) - 1]
        for r in replicas[len(seq) :]:
            seq.append(_replica_map(r))
        if trailer:
            _give_trailer(seq[-1], trailer)
        return
    shorthand = [k for k in ("device", "endpoint", "model") if k in dep_doc]
    keys = list(dep_doc.keys())
    if shorthand:
        pos = keys.index(shorthand[0])
    else:
        present = [keys.index(k) + 1 for k in _REPLICAS_AFTER if k in dep_doc]
        pos = max(present) if present else len(keys)
    for key in shorthand:
        del dep_doc[key]
    seq = CommentedSeq([_replica_map(r) for r in replicas])
    dep_doc.insert(min(pos, len(dep_doc)), "replicas", seq)


def set_key(mapping: CommentedMap, key: str, value: object) -> None:
    """Set ``key`` only when its value differs (an unchanged file stays byte-identical)."""
    if mapping.get(key) != value:
        mapping[key] = value


def set_threads(dep_doc: CommentedMap, threads: int) -> None:
    """``threads`` on one deployment; a new key goes after the scalar settings, before
    ``replicas`` (or the one-worker shorthand), where an operator would write it."""
    if "threads" in dep_doc:
        set_key(dep_doc, "threads", threads)
        return
    keys = list(dep_doc.keys())
    present = [keys.index(k) + 1 for k in _THREADS_AFTER if k in dep_doc]
    later = [keys.index(k) for k in ("replicas", "device", "endpoint") if k in dep_doc]
    pos = max(present) if present else (min(later) if later else len(keys))
    dep_doc.insert(min(pos, len(dep_doc)), "threads", threads)


def child(mapping: CommentedMap, key: str) -> CommentedMap:
    """``mapping[key]`` as a mapping, created when absent."""
    if not isinstance(mapping.get(key), CommentedMap):
        mapping[key] = CommentedMap()
    node: CommentedMap = mapping[key]
    return node


def deployment_doc(doc: CommentedMap, name: str) -> CommentedMap:
    """The deployment's mapping in the document. A file that declares no deployment (none, or
    ``{}``) gets the embedded default written out first (as the schema fills it in), so a flag
    can edit it like any declared one."""
    catalog = child(child(doc, "global"), "model_catalog")
    if not isinstance(catalog.get("deployments"), CommentedMap) or not catalog["deployments"]:
        deployments = CommentedMap()
        for dep_name, dep in embedded_default_deployments().items():
            dep_doc = CommentedMap(provider=dep.provider, artifact=dep.artifact)
            dep_doc["replicas"] = CommentedSeq([_replica_map(r) for r in dep.effective_replicas()])
            deployments[dep_name] = dep_doc
        catalog["deployments"] = deployments
    node: CommentedMap = catalog["deployments"][name]
    return node
