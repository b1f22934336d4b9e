"""The session's leak check (``tests/conftest.py``) sees what a test leaves: a process started by the
suite, a listening socket, an entry in the temp directory -- and nothing once they are gone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import SESSION_MARKER, snapshot


def test_a_child_process_a_listening_socket_and_a_temp_entry_are_seen_until_cleaned_up() -> None:
    marker = os.environ[SESSION_MARKER]  # set by the session fixture, inherited by children
    roots = [Path(tempfile.gettempdir())]
    before = set(snapshot(marker, roots))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    listener = socket.create_server(("127.0.0.1", 0))
    entry = Path(tempfile.mkdtemp(prefix="leak-check-"))
    try:
        found = set(snapshot(marker, roots)) - before
        port = listener.getsockname()[1]
        assert any(item.startswith(f"process pid {child.pid}:") for item in found), found
        assert f"listening socket 127.0.0.1:{port} of the test process" in found
        assert any(item.startswith(f"temp entry {entry}") for item in found), found
    finally:
        child.kill()
        child.wait(10)
        listener.close()
        entry.rmdir()
    assert set(snapshot(marker, roots)) - before == set()
