"""Runnable examples; ``trio-jobs dev`` runs :mod:`trio_jobs.examples.onboarding`."""
