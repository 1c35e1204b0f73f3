"""The session's loopback guard (root conftest.py, tests/client_env.py): every subprocess a test starts carries the
update-check switches and the proxy recorder, and what would have left the machine is caught and recorded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import client_env


def test_this_process_carries_the_guards():
    assert client_env.missing_guards(os.environ, client_env.recorder().url) == []
    assert os.environ["HTTPS_PROXY"] == client_env.recorder().url


@pytest.mark.parametrize("drop", ["HF_HUB_DISABLE_UPDATE_CHECK", "HTTPS_PROXY"])
def test_a_subprocess_without_the_guards_is_refused(drop):
    env = {k: v for k, v in os.environ.items() if k != drop}
    with pytest.raises(AssertionError, match=drop):
        subprocess.run([sys.executable, "-c", "print('never runs')"], env=env, timeout=60)


def test_child_env_puts_the_guards_back_on_a_bare_environment():
    env = client_env.child_env({"PATH": os.environ.get("PATH", "")}, EXTRA="1")
    assert client_env.missing_guards(env, client_env.recorder().url) == [] and env["EXTRA"] == "1"


def test_a_request_for_another_host_reaches_the_recorder_not_the_network():
    """The control: a child asking for a public host through urllib (which honours the proxy variables) is
    recorded; the session check would then fail the test, so the record is taken back here."""
    seen = client_env.recorder().seen
    before = len(seen)
    script = ("import urllib.request\ntry:\n    urllib.request.urlopen('https://pypi.org/pypi/pip/json', timeout=10)\n"
              "except Exception as exc:\n    print(type(exc).__name__)\n")
    proc = subprocess.run([sys.executable, "-c", script], env=client_env.child_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    caught = seen[before:]
    del seen[before:]
    assert any(b"CONNECT pypi.org:443" in request for request in caught), caught
