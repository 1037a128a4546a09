"""LocalCluster: a real TensorFlow cluster of in-process servers on 127.0.0.1."""

import portpicker
import tensorflow as tf

# The coordinator connects as "chief"; tf.distribute adds that job itself.
_WORKER_JOB = "worker"
_PS_JOB = "ps"


class LocalCluster:
  """λ learner (worker) servers and some ps servers in this process.

  Each task is a `tf.distribute.Server` with gRPC on a free 127.0.0.1 port.
  TensorFlow allows one cluster per process: connecting a strategy to a
  second cluster invalidates objects of the first.

  Args:
    num_ps: parameter-server tasks (>= 1).
    num_learners: worker tasks, λ (>= 1).
  """

  def __init__(self, num_ps=1, num_learners=1):
    for name, value in (("num_ps", num_ps), ("num_learners", num_learners)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"LocalCluster needs {name} >= 1, got {value!r}.")
    self.num_ps = num_ps
    self.num_learners = num_learners
    self.cluster_spec = tf.train.ClusterSpec({
        _WORKER_JOB: [f"127.0.0.1:{portpicker.pick_unused_port()}"
                      for _ in range(num_learners)],
        _PS_JOB: [f"127.0.0.1:{portpicker.pick_unused_port()}"
                  for _ in range(num_ps)],
    })
    config = tf.compat.v1.ConfigProto()
    # In-process clusters hang unless each server has more inter-op threads
    # than there are learners (TF's own multi-worker test base does this).
    config.inter_op_parallelism_threads = num_learners + 1
    self.servers = [
        tf.distribute.Server(self.cluster_spec, job_name=job, task_index=i,
                             config=config, protocol="grpc", start=True)
        for job, count in ((_WORKER_JOB, num_learners), (_PS_JOB, num_ps))
        for i in range(count)]
    self.resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        self.cluster_spec, rpc_layer="grpc")

  def __repr__(self):
    return (f"LocalCluster(num_ps={self.num_ps}, "
            f"num_learners={self.num_learners}, "
            f"spec={self.cluster_spec.as_dict()})")
