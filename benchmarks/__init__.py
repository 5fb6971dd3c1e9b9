"""Benchmarks for trio-jobs (not tests): ``python -m benchmarks``.

They run on Trio's real clock and report medians of several runs; the figures
and the command that reproduces them are in ``benchmarks/README.md``.
"""
