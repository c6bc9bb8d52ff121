"""What makes replicas of one deployment compatible: the limits config sets, and the revision
and capabilities every replica must share (the page: "All replicas of a deployment use the same
artifact, revision, engine arguments and capabilities"). Pure functions of reported data; the
pool keeps a replica that differs out of dispatch (``incompatible``), and a reload refuses a new
generation that would be."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from vllm_sr.pool.settings import PoolSettings

# Capability fields compared across replicas (what a caller's answer depends on); ``dtype`` is
# the precision the worker resolved (engine_args.dtype: auto may resolve differently per host).
CAPABILITY_FIELDS = ("surfaces", "dimensions", "max_length", "labels", "dtype")


def limits_problem(settings: PoolSettings, limits: Mapping[str, object]) -> str | None:
    wanted = {
        "max_num_seqs": settings.configured_max_num_seqs,
        "max_num_batched_tokens": settings.configured_max_num_batched_tokens,
    }
    wrong = [
        f"{name} is {limits.get(name)!r}, config sets {value}"
        for name, value in wanted.items()
        if value is not None and limits.get(name) != value
    ]
    return "reported limits differ from config: " + "; ".join(wrong) if wrong else None


def peer_problem(
    revision: str | None,
    capabilities: Mapping[str, object] | None,
    peers: Iterable[tuple[str, str | None, Mapping[str, object] | None]],
) -> str | None:
    """How this replica differs from the first peer (id, revision, capabilities) that reported
    the same things, or None. Peers that reported nothing are not compared."""
    for peer_id, peer_rev, peer_caps in peers:
        if revision is not None and peer_rev is not None and revision != peer_rev:
            return f"revision {revision} differs from {peer_id}'s {peer_rev}"
        if capabilities and peer_caps:
            diff = [
                f"{k} {capabilities.get(k)!r} vs {peer_caps.get(k)!r}"
                for k in CAPABILITY_FIELDS
                if capabilities.get(k) != peer_caps.get(k)
            ]
            if diff:
                return f"capabilities differ from {peer_id}'s: " + "; ".join(diff)
    return None
