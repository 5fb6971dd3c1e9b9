"""A module that does not import."""

raise RuntimeError("boom at import")
