"""The rules of a cluster (Envoy's one cluster concept), shared by the pool's worker replicas
(:mod:`vllm_sr.pool`) and the router's LLM backends (:mod:`vllm_sr.router.backends`).

Pure logic on an injected clock, no I/O; each user keeps its own transport (the worker's
socket, the outbound HTTP client) and its own settings (``PoolSettings``, a model's
``reliability``):

- :mod:`~vllm_sr.cluster.ejection`: consecutive-failure ejection, its cool-down's growth and
  caps, and the order of the rules that hold it back;
- :mod:`~vllm_sr.cluster.health`: the active health probe's schedule (a doubling backoff
  after a failed probe, an optional period while healthy);
- :mod:`~vllm_sr.cluster.picking`: least-loaded picking and the smooth weighted round robin.

The doubling backoff itself is :class:`vllm_sr.backoff.Backoff`.
"""

from __future__ import annotations
