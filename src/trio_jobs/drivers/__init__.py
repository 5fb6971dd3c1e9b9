"""Drivers: the protocol every driver implements, and the shipped drivers."""

from ._protocol import *  # noqa: F403
from ._protocol import __all__ as _protocol_all
from .memory import MemoryDriver, memory_driver

__all__ = [*_protocol_all, "MemoryDriver", "memory_driver"]
