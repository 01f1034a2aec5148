"""Start and stop the product's processes: a private redis-server, web (daphne), inference
workers and Celery, each in its own session, stopped in order with a bounded wait.

`make run` (scripts/run.py), the benchmarks (`python -m bench`) and the end-to-end tests all
start the product through this package. It is a top-level package rather than a Django app or
a module under scripts/ because it runs before any settings exist (the test suite starts its
Redis before Django is set up) and must be importable from all three without Django; scripts/
holds entry points, not importable code.
"""
