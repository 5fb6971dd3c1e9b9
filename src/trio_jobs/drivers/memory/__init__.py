"""The in-process memory driver: the reference semantics, used by the harness and the simulation."""

from ._driver import MemoryDriver, memory_driver

__all__ = ["MemoryDriver", "memory_driver"]
