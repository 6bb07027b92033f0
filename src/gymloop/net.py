"""Loopback ports for the servers gymloop starts (its own, vLLM's, a fleet's): one way to ask the
kernel for free ones. (Peer-side scripts, which import nothing of gymloop, bind port 0 themselves.)"""
from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free on 127.0.0.1 now (held together while asked, so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]
