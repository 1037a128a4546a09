r"""One task of a benchmark cluster (run by benchmarks/throughput.py).

Every task of the local cluster runs this script with its own TF_CONFIG.
With a parameter-server strategy ("rudra", "parameter_server": TensorFlow's
stock ParameterServerStrategy) the ps and worker tasks serve and the chief
trains; with "multi_worker_mirrored" the chief and every worker train (one
all-reduce per step). Training is two epochs of --steps_per_epoch steps:
the first warms up (tracing, connections), the second is timed. The chief
writes the figures to --out, with the timed epoch's begin and end on the
machine's monotonic clock; every task writes its peak memory and its CPU
time samples (benchmarks/cpu_meter.py) to task_<type>_<index>.json.
"""

import json
import os
import resource
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

from benchmarks import cpu_meter  # pylint: disable=g-import-not-at-top
from launch import train as launch_train  # defines the launch flags

STRATEGIES = ("single", "rudra", "parameter_server", "multi_worker_mirrored")
flags.DEFINE_enum("strategy", "rudra", STRATEGIES, "The contender.")
flags.DEFINE_bool("consistent_pulls", True, "RudraStrategy consistent_pulls.")
flags.DEFINE_float("blob_mb", 0, "Train benchmarks/blob_model.py's model of "
                   "this many MB of weights instead of --model (ps capacity).")
flags.DEFINE_string("out", None, "Directory for the figures (JSON files).")
FLAGS = flags.FLAGS


def peak_memory_mb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_task_figures(task_name, meter):
  """This task's peak memory and CPU samples (read by benchmarks/results)."""
  write_json(f"task_{task_name.replace(':', '_')}.json",
             {"task": task_name, "peak_memory_mb": peak_memory_mb(),
              "cpu_samples": meter.samples()})


def write_json(name, payload):
  os.makedirs(FLAGS.out, exist_ok=True)
  path = os.path.join(FLAGS.out, name)
  with open(path + ".tmp", "w") as stream:
    json.dump(payload, stream, indent=2)
  os.replace(path + ".tmp", path)


def make_strategy(name, protocol, consistent_pulls):
  """The contender's strategy; a clear error lists the valid names."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  if name == "rudra":
    return rudra_tf.RudraStrategy(resolver, protocol=protocol,
                                  consistent_pulls=consistent_pulls)
  if name == "parameter_server":
    return tf.distribute.experimental.ParameterServerStrategy(resolver)
  if name == "single":
    return tf.distribute.get_strategy()  # one process, no cluster
  if name == "multi_worker_mirrored":
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
  raise ValueError(f"Unknown strategy {name!r}; valid strategies are "
                   f"{', '.join(STRATEGIES)}.")


class EpochTimer:
  """Wall time of each epoch, and the Rudra counters at its ends."""

  def __init__(self, strategy, keras):
    timer = self

    class Callback(keras.callbacks.Callback):

      def on_epoch_begin(self, epoch, logs=None):
        timer.begin[epoch] = (time.monotonic(), timer.counters())

      def on_epoch_end(self, epoch, logs=None):
        timer.end[epoch] = (time.monotonic(), timer.counters())

    self.callback = Callback()
    self.begin, self.end = {}, {}
    self._strategy = strategy

  def counters(self):
    if not hasattr(self._strategy, "staleness_report"):
      return None
    report = self._strategy.staleness_report()
    return {"updates": report.timestamp, "gradients": report.gradients,
            "staleness_mean": report.mean}


def train(config):
  """Fits two epochs; returns the timed epoch's figures (chief only)."""
  import models  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  from rudra_tf import datasets  # pylint: disable=g-import-not-at-top
  keras = models.keras_module(config.keras)  # tf_keras or Keras 3
  keras.utils.set_random_seed(config.seed)
  data = datasets.load_dataset(config.dataset, config.data_dir)
  strategy = make_strategy(FLAGS.strategy, config.protocol,
                           FLAGS.consistent_pulls)
  with strategy.scope():
    if FLAGS.blob_mb:
      from benchmarks import blob_model  # pylint: disable=g-import-not-at-top
      model = blob_model.blob_model(FLAGS.blob_mb, data.input_shape,
                                    data.num_classes)
    else:
      model = models.build_model(config.model, data.input_shape,
                                 data.num_classes, keras=config.keras)
    optimizer = keras.optimizers.SGD(config.lr, momentum=config.momentum)
    if FLAGS.strategy == "rudra":
      optimizer = rudra_tf.StalenessAwareOptimizer(
          optimizer, lr_policy=config.lr_policy)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  steps_per_execution=config.steps_per_execution)
  timer = EpochTimer(strategy, keras)

  def dataset_fn(context):
    learner = context.input_pipeline_id if context else 0
    return datasets.with_step_time(
        data.learner_dataset(context, config.minibatch, seed=config.seed),
        config.learner_step_time_s(learner))

  steps = config.steps_per_epoch
  # tf_keras's fit takes a dataset function as a DatasetCreator; Keras 3's
  # (rudra_tf's, under RudraStrategy) as it is.
  data_source = (keras.utils.experimental.DatasetCreator(dataset_fn)
                 if config.keras == "tf_keras" else dataset_fn)
  model.fit(data_source, epochs=2, steps_per_epoch=steps, verbose=0,
            callbacks=[timer.callback])
  seconds = timer.end[1][0] - timer.begin[1][0]
  learners = config.num_learners
  if FLAGS.strategy == "rudra":
    before, after = timer.begin[1][1], timer.end[1][1]
    gradients = after["gradients"] - before["gradients"]
    updates = after["updates"] - before["updates"]
    staleness = after["staleness_mean"]
  elif FLAGS.strategy == "parameter_server":
    gradients = updates = steps
    staleness = None
  elif FLAGS.strategy == "single":
    gradients = updates = steps
    staleness = None
  else:  # single, or one all-reduced update of λ gradients per step
    gradients, updates, staleness = steps * learners, steps, 0.0
  return {"seconds": seconds, "timed_begin": timer.begin[1][0],
          "timed_end": timer.end[1][0], "steps": steps,
          "updates_per_s": updates / seconds,
          "pushes_per_s": gradients / seconds,
          "examples_per_s": gradients * config.minibatch / seconds,
          "staleness_mean": staleness}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  meter = cpu_meter.CpuMeter()
  if FLAGS.strategy == "single":
    config = launch_train.launch_flags.resolve_config(FLAGS, 1, 1)
    figures = train(config)
    write_task_figures("single:0", meter)
    write_json("figures.json", figures)
    print(f"single: {figures}", flush=True)
    return 0
  tf_config = json.loads(os.environ["TF_CONFIG"])
  task = tf_config["task"]
  task_name = f"{task['type']}:{task.get('index', 0)}"
  cluster = tf_config["cluster"]
  num_learners = len(cluster.get("worker", ())) + (
      1 if FLAGS.strategy == "multi_worker_mirrored" else 0)
  config = launch_train.launch_flags.resolve_config(
      FLAGS, num_learners, max(1, len(cluster.get("ps", ()))))

  def record_memory_and_exit(signum, frame):
    del frame
    write_task_figures(task_name, meter)
    os._exit(0 if signum == signal.SIGTERM else 1)  # pylint: disable=protected-access

  if task["type"] != "chief":
    # The cluster stops the other tasks with SIGTERM once the chief is done
    # (a synchronous worker may still be finishing its own fit).
    signal.signal(signal.SIGTERM, record_memory_and_exit)
  if FLAGS.strategy != "multi_worker_mirrored" and task["type"] != "chief":
    code = launch_train.serve(launch_train.launch_flags.TaskSpec(
        cluster, task["type"], task.get("index", 0)))
    if code == 0:
      record_memory_and_exit(signal.SIGTERM, None)
    return code
  figures = train(config)
  write_task_figures(task_name, meter)
  if task["type"] == "chief":
    write_json("figures.json", figures)
    print(f"{FLAGS.strategy}: {figures}", flush=True)
  sys.stdout.flush()
  os._exit(0)  # the coordinator's threads can keep a process alive


if __name__ == "__main__":
  app.run(main)
