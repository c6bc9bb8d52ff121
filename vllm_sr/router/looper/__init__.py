"""Loopers: decisions that answer with several internal calls (upstream's ``pkg/looper``)."""
