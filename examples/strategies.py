"""The tutorial's cluster, and the one line the examples change: the strategy."""

from absl import flags

STRATEGIES = ("rudra", "stock")
flags.DEFINE_enum("strategy", "rudra", STRATEGIES,
                  "RudraStrategy (async) or TF's ParameterServerStrategy.")


def make_strategy(name, cluster_resolver, variable_partitioner):
  """The strategy line: the only line that changes."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  if name == "rudra":
    return rudra_tf.RudraStrategy(cluster_resolver,
                                  variable_partitioner=variable_partitioner)
  return tf.distribute.experimental.ParameterServerStrategy(
      cluster_resolver, variable_partitioner=variable_partitioner)


# The tutorial's in-process cluster and its variable partitioner.
NUM_WORKERS = 3
NUM_PS = 2


def tutorial_strategy(name):
  """The tutorial's cluster (3 workers, 2 ps tasks: in-process servers, as
  its create_in_process_cluster starts them) and strategy `name`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=NUM_PS, num_learners=NUM_WORKERS)
  variable_partitioner = (
      tf.distribute.experimental.partitioners.MinSizePartitioner(
          min_shard_bytes=(256 << 10), max_shards=NUM_PS))
  return cluster, make_strategy(name, cluster.resolver, variable_partitioner)
