"""Benchmarks: each module is a script (`python bench/NAME.py`, `make bench-*`); the package
lets them share helpers and lets mypy check them."""
