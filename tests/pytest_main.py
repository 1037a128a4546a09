"""Runs one pytest file as a Bazel py_test: `pytest_main.py tests/test_x.py`."""

import os
import sys

import pytest

if __name__ == "__main__":
  # Bazel runs tests from the runfiles root of this workspace; put it first
  # so `import rudra_tf`, `models`, `launch` and `tests` resolve there.
  sys.path.insert(0, os.getcwd())
  sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
