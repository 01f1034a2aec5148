"""Benchmarks that measure the running product the way LLM serving is measured."""
