"""Ports for the process groups and stores this project starts (one home; loopback by default)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on `host` (racy on a busy machine: prefer `reserve_port`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def reserve_port(host: str = "127.0.0.1") -> socket.socket:
    """A listening socket on a free port of `host`, for rank 0's rendezvous store: pass it to
    `CollectiveTransport(..., listen_socket=...)` and its port (`getsockname()[1]`) to the receivers,
    so no other process can take the port in between."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(128)
    return sock
