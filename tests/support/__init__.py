"""Shared test helpers: tiny models built with transformers and real worker processes."""
