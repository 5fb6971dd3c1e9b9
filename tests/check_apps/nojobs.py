"""A module with no jobs."""

VALUE = 1
