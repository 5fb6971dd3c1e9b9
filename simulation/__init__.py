"""Seeded simulation scenarios for trio-jobs, run as a CI gate.

``python -m simulation run --scenario NAME --seed N`` replays one seed;
``python -m simulation run --scenario NAME --seeds 1000`` runs a batch;
``python -m simulation gate`` runs every pinned regression seed plus a random
batch (the CI gate, ``nox -s simulation``).
"""
