"""Runs a cluster scenario in a fresh process: TensorFlow allows one cluster
per process, and a deadlock must fail a test, not hang the suite."""

import multiprocessing
import traceback

DEFAULT_TIMEOUT_S = 300


def _child(connection, fn, kwargs):
  try:
    connection.send((True, fn(**kwargs)))
  except BaseException:  # pylint: disable=broad-except
    connection.send((False, traceback.format_exc()))
  finally:
    connection.close()


def run_in_fresh_process(fn, *, timeout=DEFAULT_TIMEOUT_S, **kwargs):
  """Calls `fn(**kwargs)` in a spawned process and returns its result.

  Raises:
    TimeoutError: the scenario did not finish (the process is killed).
    AssertionError: the scenario raised; the message holds its traceback.
  """
  context = multiprocessing.get_context("spawn")
  receiver, sender = context.Pipe(duplex=False)
  process = context.Process(target=_child, args=(sender, fn, kwargs))
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
