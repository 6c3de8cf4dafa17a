"""Benchmarks, demo data and real-process helpers: `manage.py bench`, `demo` and `produce`.

A Django app of its own (`queues.bench`), installed by the standalone project and never imported
by the product, so that a host project installs QueueAdmin without it.
"""
