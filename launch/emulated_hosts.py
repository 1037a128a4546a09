r"""EmulatedHosts: hosts on one machine, each a network namespace of its own.

Every host is a network namespace with its own loopback and one link,
`eth0`, to a switch: a bridge in one more namespace. Hosts get addresses in
a /24 of a subnet this harness reserves for itself (10.213.0.0/16); no
address, link or route is added to the machine's own namespace, so no
traffic reaches or leaves anything the harness did not make. A host's link
may be rate-limited (tc tbf, in both directions: on `eth0` for what it
sends, on its switch port for what it receives); links can be taken down
and brought back (a host cut off, then reconnected).

    with EmulatedHosts(4, rate_mbit=20) as hosts:
      server = hosts.run(0, ["python", "-m", "launch.train", ...],
                         env={"TF_CONFIG": ...})
      hosts.address(0)                        # "10.213.7.1"
      hosts.set_link(2, up=False)             # host 2 cut off
      hosts.set_link(2, up=True)
      hosts.link_bytes()                      # {host: (sent, received)}

States:

    new ──start()──▶ up ──close()──▶ closed
     │  (fails: close() │ run(), set_link(), set_rate()
     │   undoes what it │
     └─ made, re-raises)┘

`close()` always runs: on leaving the `with` block (also on an exception
and on Ctrl-C), at interpreter exit, and on SIGTERM; it kills every process
started in a host (and anything else found inside a host's namespace) and
deletes the namespaces, which deletes their links and the bridge. Nothing
is left behind. Namespaces left by a harness whose process was killed
(SIGKILL) are deleted by the next harness that starts (`remove_orphans`).

Needs root and iproute2 (`ip`, `tc`); `available()` says whether this
machine can, and why not.
"""

import atexit
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time

# Every name this harness gives a namespace starts with this, then the pid
# of the process that owns it (to find orphans), then a serial number.
NAMESPACE_PREFIX = "rtfhost"
# The harness's own addresses: one /24 per harness inside it.
SUBNET = ipaddress.ip_network("10.213.0.0/16")
# tbf's bucket and queue: a burst of 10 ms of traffic (32 KiB at least:
# a bucket smaller than the kernel timer's tick of traffic caps the rate
# below the one asked for), and at most 50 ms of queued traffic before the
# link drops (a switch port's buffer).
TBF_MIN_BURST_BYTES = 32 * 1024
TBF_BURST_S = 0.010
TBF_BURST = "32kb"
TBF_LATENCY = "50ms"


def tbf_burst_bytes(rate_mbit):
  return max(TBF_MIN_BURST_BYTES, int(rate_mbit * 1e6 / 8 * TBF_BURST_S))


# How long a killed process gets to exit after SIGTERM before SIGKILL.
KILL_GRACE_S = 5
# LinkMeter's sampling period. A window's bytes are interpolated between
# the samples around each end, so each end can be off by up to one period's
# traffic: 0.1 s keeps that a small share of a one-second epoch, while one
# sample (an `ip -s -j link show`, about 2 ms) every 0.1 s costs about 2% of
# a core.
LINK_METER_PERIOD_S = 0.1

_serials = iter(range(1, 1 << 30))
_serial_lock = threading.Lock()


def _ip(*args, check=True):
  return subprocess.run(["ip", *args], check=check, capture_output=True,
                        text=True)


def available():
  """(True, "") if this machine can make emulated hosts, else (False, why)."""
  if os.geteuid() != 0:
    return False, "emulated hosts need root (network namespaces)"
  for tool in ("ip", "tc"):
    if shutil.which(tool) is None:
      return False, f"emulated hosts need iproute2's `{tool}`"
  # Everything start() does, once, in a namespace of its own.
  probe = f"{NAMESPACE_PREFIX}{os.getpid()}probe"
  steps = [("ip", "netns", "add", probe),
           ("ip", "-n", probe, "link", "add", "br0", "type", "bridge"),
           ("ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer",
            "name", "eth0"),
           ("ip", "-n", probe, "link", "set", "p0", "master", "br0"),
           ("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "eth0",
            "root", "tbf", "rate", "1mbit", "burst", TBF_BURST, "latency",
            TBF_LATENCY)]
  try:
    for step in steps:
      done = subprocess.run(step, capture_output=True, text=True,
                            check=False)
      if done.returncode != 0:
        return False, (f"this machine cannot make emulated hosts: "
                       f"`{' '.join(step)}` failed: {done.stderr.strip()}")
  finally:
    _ip("netns", "del", probe, check=False)
  return True, ""


def _namespaces():
  listed = _ip("netns", "list", check=False).stdout
  return [line.split()[0] for line in listed.splitlines() if line.strip()]


def _owner(namespace):
  match = re.match(rf"{NAMESPACE_PREFIX}(\d+)x", namespace)
  return int(match.group(1)) if match else None


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def _kill_namespace_processes(namespace):
  pids = _ip("netns", "pids", namespace, check=False).stdout.split()
  for pid in pids:
    try:
      os.kill(int(pid), signal.SIGKILL)
    except (ProcessLookupError, ValueError):
      pass


def remove_orphans():
  """Deletes namespaces of harnesses whose owning process is gone."""
  for namespace in _namespaces():
    owner = _owner(namespace)
    if owner is not None and not _alive(owner):
      _kill_namespace_processes(namespace)
      _ip("netns", "del", namespace, check=False)


class EmulatedHosts:
  """`count` emulated hosts on one switch (see the module docstring).

  Args:
    count: hosts (>= 1).
    rate_mbit: each host link's rate in Mbit/s, both ways; None: unlimited.
  """

  def __init__(self, count, rate_mbit=None):
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
      raise ValueError(f"EmulatedHosts needs count >= 1, got {count!r}.")
    _check_rate(rate_mbit)
    with _serial_lock:
      serial = next(_serials)
    self._name = f"{NAMESPACE_PREFIX}{os.getpid()}x{serial}"
    self._count = count
    self._rate_mbit = rate_mbit
    self._network = list(SUBNET.subnets(new_prefix=24))[
        (os.getpid() * 7 + serial) % 256]
    self._processes = []
    self._state = "new"
    self._lock = threading.Lock()
    self._previous_sigterm = None

  # ------------------------------------------------------------ lifecycle
  def __enter__(self):
    self.start()
    return self

  def __exit__(self, *exc_info):
    self.close()

  def start(self):
    """Makes the switch, the hosts and their links; `close()` on failure."""
    if self._state != "new":
      raise RuntimeError(f"EmulatedHosts.start() on a harness that is "
                         f"{self._state}.")
    ok, why = available()
    if not ok:
      raise RuntimeError(why)
    remove_orphans()
    self._state = "up"  # from here on, close() undoes whatever was made
    atexit.register(self.close)
    if threading.current_thread() is threading.main_thread():
      self._previous_sigterm = signal.signal(signal.SIGTERM,
                                             self._close_on_sigterm)
    try:
      switch = self.switch_namespace
      _ip("netns", "add", switch)
      _ip("-n", switch, "link", "add", "br0", "type", "bridge")
      _ip("-n", switch, "link", "set", "br0", "up")
      for host in range(self._count):
        namespace = self.namespace(host)
        _ip("netns", "add", namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", switch, "link", "add", f"p{host}", "type", "veth", "peer",
            "name", "eth0", "netns", namespace)
        _ip("-n", switch, "link", "set", f"p{host}", "master", "br0")
        _ip("-n", switch, "link", "set", f"p{host}", "up")
        _ip("-n", namespace, "addr", "add",
            f"{self.address(host)}/{self._network.prefixlen}", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        if self._rate_mbit is not None:
          self._limit(host, self._rate_mbit, replace=False)
    except BaseException:
      self.close()
      raise
    return self

  def close(self):
    """Kills every process in the hosts and deletes every namespace."""
    with self._lock:
      if self._state != "up":
        self._state = "closed"
        return
      self._state = "closed"
    for process in self._processes:
      _stop(process)
    for namespace in [self.namespace(h) for h in range(self._count)] + [
        self.switch_namespace]:
      _kill_namespace_processes(namespace)
      _ip("netns", "del", namespace, check=False)
    if self._previous_sigterm is not None:
      signal.signal(signal.SIGTERM, self._previous_sigterm)
      self._previous_sigterm = None
    atexit.unregister(self.close)

  def _close_on_sigterm(self, signum, frame):
    self.close()
    previous = self._previous_sigterm
    if callable(previous):
      previous(signum, frame)
    else:
      raise SystemExit(128 + signum)

  # --------------------------------------------------------------- hosts
  @property
  def count(self):
    return self._count

  @property
  def up(self):
    """Whether the hosts exist (started, not yet closed)."""
    return self._state == "up"

  @property
  def switch_namespace(self):
    return f"{self._name}sw"

  def namespace(self, host):
    return f"{self._name}h{self._index(host)}"

  def address(self, host):
    """The host's address: .1 for host 0, .2 for host 1, ..."""
    return str(self._network.network_address + self._index(host) + 1)

  def run(self, host, argv, env=None, **popen_kwargs):
    """Starts `argv` in the host (its own process group); returns the
    Popen. It is killed at close() if still running."""
    self._require_up()
    process = subprocess.Popen(
        ["ip", "netns", "exec", self.namespace(host), *argv],
        env=env, start_new_session=True, **popen_kwargs)
    self._processes.append(process)
    return process

  def set_link(self, host, up):
    """Takes the host's link down (cut off from every other host) or up."""
    self._require_up()
    _ip("-n", self.namespace(host), "link", "set", "eth0",
        "up" if up else "down")

  def set_rate(self, host, rate_mbit):
    """Sets (None: removes) the rate limit of the host's link, both ways."""
    self._require_up()
    _check_rate(rate_mbit)
    if rate_mbit is None:
      for namespace, device in self._link_ends(host):
        subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc",
                        "del", "dev", device, "root"], check=False,
                       capture_output=True)
      return
    self._limit(host, rate_mbit, replace=True)

  def qdiscs(self, host):
    """`tc qdisc show` of both ends of the host's link (for checks)."""
    return [subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc",
                            "show", "dev", device], check=True,
                           capture_output=True, text=True).stdout.strip()
            for namespace, device in self._link_ends(host)]

  def link_bytes(self):
    """{host: (bytes sent, bytes received)} on each host's link so far
    (Ethernet frames, as the rate limit counts them), read from the
    switch's ports in one call: what a port transmits, its host received."""
    self._require_up()
    links = json.loads(subprocess.run(
        ["ip", "-n", self.switch_namespace, "-s", "-j", "link", "show"],
        check=True, capture_output=True, text=True).stdout)
    counts = {}
    for link in links:
      port = re.fullmatch(r"p(\d+)", link["ifname"])
      if port:
        stats = link["stats64"]
        counts[int(port.group(1))] = (stats["rx"]["bytes"],
                                      stats["tx"]["bytes"])
    return counts

  def _limit(self, host, rate_mbit, replace):
    for namespace, device in self._link_ends(host):
      subprocess.run(
          ["ip", "netns", "exec", namespace, "tc", "qdisc",
           "replace" if replace else "add", "dev", device, "root", "tbf",
           "rate", f"{rate_mbit}mbit", "burst",
           str(tbf_burst_bytes(rate_mbit)), "latency", TBF_LATENCY],
          check=True, capture_output=True, text=True)

  def _link_ends(self, host):
    return [(self.namespace(host), "eth0"),
            (self.switch_namespace, f"p{self._index(host)}")]

  def _index(self, host):
    if not isinstance(host, int) or not 0 <= host < self._count:
      raise ValueError(f"host {host!r} does not exist; hosts are 0 to "
                       f"{self._count - 1}.")
    return host

  def _require_up(self):
    if self._state != "up":
      raise RuntimeError(f"EmulatedHosts is {self._state}; start() it (or "
                         "enter its `with` block) first.")


def _check_rate(rate_mbit):
  if rate_mbit is not None and (isinstance(rate_mbit, bool) or
                                not isinstance(rate_mbit, (int, float)) or
                                rate_mbit <= 0):
    raise ValueError(f"rate_mbit must be a positive number of Mbit/s or "
                     f"None (unlimited), got {rate_mbit!r}.")


def _stop(process):
  if process.poll() is not None:
    return
  try:
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(KILL_GRACE_S)
  except (ProcessLookupError, subprocess.TimeoutExpired):
    try:
      os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    process.wait()


class LinkMeter:
  """Samples `hosts.link_bytes()` every `period_s` in a thread, with
  time.monotonic() stamps (one clock for every process on the machine), so
  that the bytes of a window a task timed can be read afterwards.

      with LinkMeter(hosts) as meter:
        ...                                   # the run; it times [t0, t1]
      meter.bytes_between(t0, t1)             # {host: (sent, received)}
  """

  def __init__(self, hosts, period_s=LINK_METER_PERIOD_S):
    self._hosts = hosts
    self._period_s = period_s
    self.samples = []  # [(monotonic time, {host: (sent, received)})]
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True)

  def __enter__(self):
    self._take()
    self._thread.start()
    return self

  def __exit__(self, *exc_info):
    self._stop.set()
    self._thread.join()
    if self._hosts.up:
      self._take()

  def _take(self):
    self.samples.append((time.monotonic(), self._hosts.link_bytes()))

  def _sample(self):
    while not self._stop.wait(self._period_s):
      if not self._hosts.up:
        return
      self._take()

  def bytes_between(self, begin, end):
    """{host: (sent, received)} in [begin, end], each counter interpolated
    linearly between the samples around each end."""
    if not self.samples or not (self.samples[0][0] <= begin <= end <=
                                self.samples[-1][0]):
      raise ValueError(f"[{begin}, {end}] is not inside the sampled window "
                       f"{[t for t, _ in self.samples[:1] + self.samples[-1:]]}.")
    at_begin, at_end = self._at(begin), self._at(end)
    return {host: tuple(e - b for b, e in zip(at_begin[host], at_end[host]))
            for host in at_end}

  def _at(self, moment):
    for (t0, c0), (t1, c1) in zip(self.samples, self.samples[1:]):
      if t0 <= moment <= t1:
        share = 0.0 if t1 == t0 else (moment - t0) / (t1 - t0)
        return {host: tuple(a + share * (b - a)
                            for a, b in zip(c0[host], c1[host]))
                for host in c1}
    return self.samples[-1][1]
