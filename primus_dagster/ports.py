"""Local TCP ports for services this process starts (DDP rendezvous, embedded brokers).

Example::

    init_method = f"tcp://127.0.0.1:{free_port()}"
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on ``host`` (small race: someone may take it before we bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
