"""Bad input is refused before any server is contacted, naming the fix."""

import pytest
import tensorflow as tf
import tf_keras

import rudra_tf


def resolver(num_ps=1, num_workers=2):
  # Addresses nobody listens on: validation must fail before connecting.
  spec = {}
  if num_workers:
    spec["worker"] = [f"127.0.0.1:{1 + i}" for i in range(num_workers)]
  if num_ps:
    spec["ps"] = [f"127.0.0.1:{100 + i}" for i in range(num_ps)]
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(spec), rpc_layer="grpc")


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(protocol="softsync"), "Unknown protocol 'softsync'"),
    (dict(protocol="0-softsync"), "n = 0"),
    (dict(protocol="3-softsync"), "λ = 2 learners"),
    (dict(protocol="async", max_staleness=0), "max_staleness"),
    (dict(protocol="async", max_staleness=-2), "got -2"),
    (dict(protocol="async", consistent_pulls="yes"), "consistent_pulls"),
])
def test_strategy_arguments(kwargs, fragment):
  with pytest.raises(ValueError) as error:
    rudra_tf.RudraStrategy(resolver(), **kwargs)
  assert fragment in str(error.value)


@pytest.mark.parametrize("num_ps,num_workers", [(0, 2), (1, 0), (0, 0)])
def test_cluster_without_ps_or_worker(num_ps, num_workers):
  with pytest.raises(ValueError) as error:
    rudra_tf.RudraStrategy(resolver(num_ps, num_workers), protocol="async")
  message = str(error.value)
  assert f"{num_ps} ps and {num_workers} worker tasks" in message


def test_wrapper_outside_a_rudra_strategy_scope():
  with pytest.raises(ValueError, match="must be created inside .*"
                     "RudraStrategy.*current strategy is"):
    rudra_tf.StalenessAwareOptimizer(tf_keras.optimizers.SGD(0.1))


@pytest.mark.parametrize("kwargs", [dict(num_ps=0), dict(num_learners=0),
                                    dict(num_learners=1.5)])
def test_local_cluster_sizes(kwargs):
  with pytest.raises(ValueError, match="LocalCluster needs"):
    rudra_tf.LocalCluster(**kwargs)


def test_import_is_light():
  import subprocess, sys  # pylint: disable=g-import-not-at-top,multiple-imports
  code = ("import sys, rudra_tf, rudra_tf.protocol; "
          "print('tensorflow' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=True).stdout.strip()
  assert out == "False"
