"""Loopback networking helpers of the dev tools."""

from __future__ import annotations

import socket

__all__ = ["LOOPBACK", "free_port"]

LOOPBACK = "127.0.0.1"
"""The address every dev process binds and connects to."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` right now (another process may take it before it is bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
