"""Runs a cluster scenario in a fresh process (TensorFlow allows one cluster
per process, and a deadlock must fail a test, not hang the suite), and the
invariants every shard's report must satisfy after any run."""

import multiprocessing
import os
import traceback

import numpy as np
import pytest

DEFAULT_TIMEOUT_S = 300


def _child(connection, fn, kwargs, exit_at_once):
  try:
    connection.send((True, fn(**kwargs)))
  except BaseException:  # pylint: disable=broad-except
    connection.send((False, traceback.format_exc()))
  finally:
    connection.close()
    if exit_at_once:
      os._exit(0)  # pylint: disable=protected-access


def run_in_fresh_process(fn, *, timeout=DEFAULT_TIMEOUT_S, exit_at_once=False,
                         **kwargs):
  """Calls `fn(**kwargs)` in a spawned process and returns its result.

  exit_at_once: end the process as soon as the result is sent, skipping
  Python's and TensorFlow's clean-up (for scenarios whose clean-up hangs).

  Raises:
    TimeoutError: the scenario did not finish (the process is killed).
    AssertionError: the scenario raised; the message holds its traceback.
  """
  context = multiprocessing.get_context("spawn")
  receiver, sender = context.Pipe(duplex=False)
  process = context.Process(target=_child,
                            args=(sender, fn, kwargs, exit_at_once))
  process.start()
  sender.close()
  try:
    if not receiver.poll(timeout):
      raise TimeoutError(
          f"{fn.__name__}({kwargs}) did not finish within {timeout} s "
          "(a deadlock?)")
    ok, payload = receiver.recv()
  except EOFError:
    process.join(5)
    raise AssertionError(
        f"{fn.__name__} died with exit code {process.exitcode}") from None
  finally:
    if process.is_alive():
      process.join(10)
    if process.is_alive():
      process.kill()
      process.join()
  if not ok:
    raise AssertionError(f"{fn.__name__}({kwargs}) failed:\n{payload}")
  return payload


def assert_invariants(report):
  """The exact invariants every shard must satisfy after any run."""
  c = report["gradients_per_update"]
  for shard in report["shards"]:
    accepted = shard["gradients"] - shard["dropped"]
    assert shard["timestamp"] * c + shard["pending"] == accepted, shard
    assert 0 <= shard["pending"] < c, shard
    assert shard["histogram"].sum() == shard["gradients"], shard
    histogram = shard["histogram"]
    if histogram[-1] == 0:  # no overflow bin: the mean is exact from it
      exact_mean = (np.arange(len(histogram)) @ histogram) / max(
          shard["gradients"], 1)
      assert shard["mean"] == pytest.approx(exact_mean, abs=1e-12)
    assert shard["max"] == int(np.max(np.nonzero(histogram)[0], initial=0))
