"""vllm-sr: places, scales and watches model workers for the vLLM Semantic Router."""

from __future__ import annotations

__version__ = "0.1.0"
API_VERSION = "v1"
