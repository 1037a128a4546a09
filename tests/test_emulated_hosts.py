"""launch/emulated_hosts.py: hosts of their own network namespaces, their
links, rates and faults, and a teardown that leaves nothing behind (after
an exception, SIGTERM, Ctrl-C, and a SIGKILLed owner's orphans).

Skipped, with the reason, where this machine cannot make namespaces."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from launch import emulated_hosts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AVAILABLE, WHY_NOT = emulated_hosts.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)

# A TCP echo of byte counts: host 0 listens, another host sends.
_RECEIVER = textwrap.dedent("""
    import socket
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 5000))
    server.listen()
    print("listening", flush=True)
    while True:
      connection, _ = server.accept()
      received = 0
      while True:
        data = connection.recv(65536)
        if not data:
          break
        received += len(data)
      print("received", received, flush=True)
""")


def _send(hosts, host, to, size, timeout=3):
  script = (f"import socket; s = socket.create_connection(({to!r}, 5000), "
            f"timeout={timeout}); s.sendall(b'x' * {size}); s.close()")
  return hosts.run(host, [sys.executable, "-c", script],
                   stderr=subprocess.PIPE, text=True)


def _leftovers(marker):
  namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True,
                              text=True, check=True).stdout
  return [line for line in namespaces.splitlines() if marker in line]


def test_hosts_reach_each_other_on_their_own_addresses_only():
  with emulated_hosts.EmulatedHosts(3, rate_mbit=40) as hosts:
    addresses = [hosts.address(host) for host in range(3)]
    assert len(set(addresses)) == 3
    assert all(emulated_hosts.ipaddress.ip_address(a) in
               emulated_hosts.SUBNET for a in addresses)
    # Nothing in the machine's own namespace: no link, no address.
    own_links = subprocess.run(["ip", "-o", "addr"], capture_output=True,
                               text=True, check=True).stdout
    assert not any(a in own_links for a in addresses)
    receiver = hosts.run(0, [sys.executable, "-c", _RECEIVER],
                         stdout=subprocess.PIPE, text=True)
    assert receiver.stdout.readline().strip() == "listening"
    for sender in (1, 2):
      assert _send(hosts, sender, addresses[0], 100_000).wait(30) == 0
      assert receiver.stdout.readline().split() == ["received", "100000"]
    # Both ends of a link are rate-limited; the limit can change or go.
    assert all("tbf" in q and "rate 40Mbit" in q for q in hosts.qdiscs(1))
    hosts.set_rate(1, 8)
    assert all("rate 8Mbit" in q for q in hosts.qdiscs(1))
    hosts.set_rate(1, None)
    assert not any("tbf" in q for q in hosts.qdiscs(1))
    # A host whose link is down reaches no one, and again once it is up.
    hosts.set_link(1, up=False)
    cut_off = _send(hosts, 1, addresses[0], 10)
    assert cut_off.wait(30) != 0
    assert "unreachable" in cut_off.stderr.read()
    hosts.set_link(1, up=True)
    assert _send(hosts, 1, addresses[0], 10).wait(30) == 0
    assert receiver.stdout.readline().split() == ["received", "10"]
    name = hosts.namespace(0)
  assert not _leftovers(name[:-2])
  assert receiver.poll() is not None  # killed at close


def test_link_bytes_count_what_each_host_sent_and_received():
  with emulated_hosts.EmulatedHosts(3) as hosts:
    receiver = hosts.run(0, [sys.executable, "-c", _RECEIVER],
                         stdout=subprocess.PIPE, text=True)
    assert receiver.stdout.readline().strip() == "listening"
    with emulated_hosts.LinkMeter(hosts, period_s=0.05) as meter:
      before = hosts.link_bytes()
      assert _send(hosts, 1, hosts.address(0), 1_000_000).wait(30) == 0
      assert receiver.stdout.readline().split() == ["received", "1000000"]
      after = hosts.link_bytes()
    sent = {host: after[host][0] - before[host][0] for host in after}
    received = {host: after[host][1] - before[host][1] for host in after}
    # The payload plus TCP/IP/Ethernet headers (~66 bytes per 1448-byte
    # segment: under 6%) and a handshake; host 2 took no part.
    assert 1_000_000 < sent[1] < 1_060_000
    assert 1_000_000 < received[0] < 1_060_000
    assert sent[2] < 1_000 and received[2] < 1_000
    # The meter's window from before the send to after it holds the same.
    window = meter.bytes_between(meter.samples[0][0], meter.samples[-1][0])
    assert 1_000_000 < window[1][0] < 1_060_000
    assert window[2][0] < 1_000
    with pytest.raises(ValueError, match="sampled window"):
      meter.bytes_between(meter.samples[0][0] - 10, meter.samples[-1][0])


def test_the_meter_interpolates_between_its_samples():
  meter = emulated_hosts.LinkMeter(hosts=None)
  meter.samples = [(0.0, {0: (0, 0)}), (2.0, {0: (100, 40)}),
                   (3.0, {0: (100, 100)})]
  # [0.5, 1.5] is half of the first interval: 50 sent, 20 received.
  assert meter.bytes_between(0.5, 1.5) == {0: (50.0, 20.0)}
  # [1, 2.5]: 50 of the first interval's 100 sent, none in the second;
  # 20 received in the first, half of the second's 60.
  assert meter.bytes_between(1.0, 2.5) == {0: (50.0, 50.0)}


def test_an_exception_inside_the_block_leaves_nothing_behind():
  with pytest.raises(RuntimeError, match="boom"):
    with emulated_hosts.EmulatedHosts(2) as hosts:
      sleeper = hosts.run(1, ["sleep", "600"])
      prefix = hosts.switch_namespace[:-2]
      raise RuntimeError("boom")
  assert not _leftovers(prefix)
  assert sleeper.poll() is not None


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_the_owner_stopped_by_a_signal_leaves_nothing_behind(how):
  owner = subprocess.Popen(
      [sys.executable, "-c", textwrap.dedent("""
          import signal, sys, time
          from launch import emulated_hosts
          # Ctrl-C as in a terminal: a runner started in the background
          # (nohup, CI) hands its children SIGINT ignored.
          signal.signal(signal.SIGINT, signal.default_int_handler)
          with emulated_hosts.EmulatedHosts(2) as hosts:
            sleeper = hosts.run(0, ["sleep", "600"])
            print(hosts.switch_namespace[:-2], sleeper.pid, flush=True)
            time.sleep(600)
      """)], stdout=subprocess.PIPE, text=True,
      env=dict(os.environ, PYTHONPATH=REPO))
  prefix, sleeper_pid = owner.stdout.readline().split()
  assert _leftovers(prefix)
  owner.send_signal(how)
  assert owner.wait(30) != 0
  assert not _leftovers(prefix)
  assert not emulated_hosts._alive(int(sleeper_pid))  # pylint: disable=protected-access


def test_a_killed_owners_namespaces_go_when_the_next_harness_starts():
  owner = subprocess.Popen(
      [sys.executable, "-c", textwrap.dedent("""
          import time
          from launch import emulated_hosts
          hosts = emulated_hosts.EmulatedHosts(2).start()
          print(hosts.switch_namespace[:-2], flush=True)
          time.sleep(600)
      """)], stdout=subprocess.PIPE, text=True,
      env=dict(os.environ, PYTHONPATH=REPO))
  prefix = owner.stdout.readline().strip()
  owner.kill()  # no clean-up can run
  owner.wait(30)
  assert len(_leftovers(prefix)) == 3  # the switch and two hosts
  with emulated_hosts.EmulatedHosts(1):
    assert not _leftovers(prefix)


def test_bad_arguments_name_the_value_and_the_valid_ones():
  with pytest.raises(ValueError, match="count >= 1, got 0"):
    emulated_hosts.EmulatedHosts(0)
  with pytest.raises(ValueError, match="rate_mbit must be a positive number "
                     "of Mbit/s or None"):
    emulated_hosts.EmulatedHosts(2, rate_mbit=-5)
  hosts = emulated_hosts.EmulatedHosts(2)
  with pytest.raises(RuntimeError, match="is new; start"):
    hosts.run(0, ["true"])
  with hosts:
    with pytest.raises(ValueError, match="host 2 does not exist; hosts are 0 "
                       "to 1"):
      hosts.address(2)
  with pytest.raises(RuntimeError, match="is closed"):
    hosts.set_link(0, up=True)
