"""One portpicker port server for the whole suite.

Every cluster a test starts (in-process servers, launched task processes)
takes its ports from portpicker. Alone, portpicker asks the kernel for a
free port in its ephemeral range and releases it; until TensorFlow binds
it, a concurrent test process's outgoing gRPC connection or another
picker can take it ("Could not start gRPC server": seen once in a suite
that runs four clusters side by side). portpicker's own port server hands
each process ports of its own, outside the ephemeral range, kept until the
process ends; portpicker uses it wherever PORTSERVER_ADDRESS is set, and
every process a test starts inherits it.
"""

import os
import socket
import subprocess
import sys
import sysconfig
import time

import pytest

# How long the port server may take to listen; without it, portpicker
# picks as before (the tests still run).
_START_TIMEOUT_S = 10


def _listening(address):
  with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
    try:
      probe.connect("\0" + address[1:])
      return True
    except OSError:
      return False


@pytest.fixture(scope="session", autouse=True)
def port_server():
  script = os.path.join(sysconfig.get_path("scripts"), "portserver.py")
  if not os.path.exists(script) or "PORTSERVER_ADDRESS" in os.environ:
    yield None
    return
  address = f"@rudra_tf_tests_{os.getpid()}"
  server = subprocess.Popen(
      [sys.executable, script, f"--portserver_address={address}"],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + _START_TIMEOUT_S
  while not _listening(address) and time.monotonic() < deadline:
    time.sleep(0.05)
  os.environ["PORTSERVER_ADDRESS"] = address
  try:
    yield address
  finally:
    del os.environ["PORTSERVER_ADDRESS"]
    server.terminate()
    server.wait(10)
