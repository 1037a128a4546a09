r"""One task of a benchmark cluster (run by benchmarks/throughput.py).

Every task of the local cluster runs this script with its own TF_CONFIG.
With a parameter-server strategy ("rudra", "parameter_server": TensorFlow's
stock ParameterServerStrategy) the ps and worker tasks serve and the chief
trains; with "multi_worker_mirrored" the chief and every worker train (one
all-reduce per step). Training is two epochs of --steps_per_epoch steps:
the first warms up (tracing, connections), the second is timed; with
--target_accuracy, epochs until the test accuracy reaches it instead
(AccuracyCurve: time to accuracy, benchmarks/protocols_on_links.py). The chief
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
flags.DEFINE_float("target_accuracy", 0, "Above 0: instead of the two-epoch "
                   "throughput run, train epochs until the test accuracy "
                   "reaches this (time to accuracy; AccuracyCurve).")
flags.DEFINE_integer("max_epochs", 30, "With --target_accuracy: the most "
                     "epochs to train.")
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


def _prepared(config):
  """The strategy, the compiled model, the data and the learners' dataset
  source of a benchmark run (as launch.train makes them)."""
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
          optimizer, lr_policy=config.lr_policy,
          compensation=config.compensation,
          compensation_strength=config.compensation_strength)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  steps_per_execution=config.steps_per_execution)

  def dataset_fn(context):
    learner = context.input_pipeline_id if context else 0
    return datasets.with_step_time(
        data.learner_dataset(context, config.minibatch, seed=config.seed),
        config.learner_step_time_s(learner))

  # tf_keras's fit takes a dataset function as a DatasetCreator; Keras 3's
  # (rudra_tf's, under RudraStrategy) as it is.
  data_source = (keras.utils.experimental.DatasetCreator(dataset_fn)
                 if config.keras == "tf_keras" else dataset_fn)
  return strategy, model, data, data_source, keras


def train(config):
  """Fits two epochs; returns the timed epoch's figures (chief only)."""
  strategy, model, _, data_source, keras = _prepared(config)
  timer = EpochTimer(strategy, keras)
  steps = config.steps_per_epoch
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


class AccuracyCurve:
  """The test accuracy after each epoch, against training time.

  fit joins at an epoch's end, so the learners idle while the chief
  evaluates its copy of the weights on the whole test split; the training
  time counts the epochs only, not those evaluations. Training stops at the
  first epoch whose test accuracy reaches `target`.
  """

  def __init__(self, strategy, model, data, config, keras, target):
    import models  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    curve = self
    self.rows = []
    self._timer = EpochTimer(strategy, keras)
    self._train_s = 0.0
    self._local = models.build_model(config.model, data.input_shape,
                                     data.num_classes, keras=config.keras)
    self._test = data.test_dataset(1000)
    self._test_size = data.test_size
    # The model called directly, not Model.evaluate: inside fit, evaluate
    # would take the strategy in scope and run on the learners.
    self._correct = tf.function(lambda x, y: tf.reduce_sum(tf.cast(
        tf.equal(tf.argmax(self._local(x, training=False), -1),
                 tf.cast(y, tf.int64)), tf.int64)))

    class Callback(keras.callbacks.Callback):

      def on_epoch_begin(self, epoch, logs=None):
        curve._timer.callback.on_epoch_begin(epoch, logs)

      def on_epoch_end(self, epoch, logs=None):
        curve._timer.callback.on_epoch_end(epoch, logs)
        curve._record(epoch, model, config.steps_per_epoch)
        if curve.rows[-1]["test_accuracy"] >= target:
          model.stop_training = True

    self.callback = Callback()

  def _record(self, epoch, model, steps):
    begin, end = self._timer.begin[epoch], self._timer.end[epoch]
    self._train_s += end[0] - begin[0]
    if end[1] is None:  # stock PSS: one gradient and one update per step
      previous = self.rows[-1] if self.rows else {"gradients": 0,
                                                  "updates": 0}
      counters = {"gradients": previous["gradients"] + steps,
                  "updates": previous["updates"] + steps,
                  "staleness_mean": None}
    else:
      counters = end[1]
    from rudra_tf import tf_hooks  # pylint: disable=g-import-not-at-top
    # The chief's own calls: no closure's cancellation reaches them (TF keeps
    # the running closure's CancellationManager in a process-wide global).
    with tf_hooks.outside_closure_cancellation():
      self._local.set_weights(model.get_weights())
      accuracy = sum(int(self._correct(x, y)) for x, y in self._test
                     ) / self._test_size
    self.rows.append({"epoch": epoch + 1, "train_s": self._train_s,
                      "test_accuracy": float(accuracy), **counters})

  def figures(self, target, minibatch):
    """Time, gradients and updates to `target` (None where not reached),
    and the rates over the epochs after the first (which traces)."""
    reached = next((row for row in self.rows
                    if row["test_accuracy"] >= target), None)
    last = self.rows[-1]
    # Rates over the epochs after the first, or the first if it was all.
    first = (self.rows[0] if len(self.rows) > 1 else
             {"train_s": 0.0, "gradients": 0, "updates": 0})
    seconds = last["train_s"] - first["train_s"]
    gradients = last["gradients"] - first["gradients"]
    updates = last["updates"] - first["updates"]
    return {
        "target_accuracy": target,
        "time_to_target_s": reached and reached["train_s"],
        "gradients_to_target": reached and reached["gradients"],
        "updates_to_target": reached and reached["updates"],
        "final_test_accuracy": last["test_accuracy"],
        "pushes_per_s": gradients / seconds,
        "updates_per_s": updates / seconds,
        "examples_per_s": gradients * minibatch / seconds,
        "staleness_mean": last["staleness_mean"],
        # The second epoch, for the CPU figures (benchmarks/results.py,
        # which divides by the rate above: that of epochs 2 on).
        "timed_begin": self._timer.begin[min(1, len(self.rows) - 1)][0],
        "timed_end": self._timer.end[min(1, len(self.rows) - 1)][0],
        "curve": self.rows}


def train_to_accuracy(config):
  """Fits epochs of --steps_per_epoch until the test accuracy reaches
  --target_accuracy (or --max_epochs); returns the AccuracyCurve figures."""
  strategy, model, data, data_source, keras = _prepared(config)
  curve = AccuracyCurve(strategy, model, data, config, keras,
                        FLAGS.target_accuracy)
  model.fit(data_source, epochs=FLAGS.max_epochs,
            steps_per_epoch=config.steps_per_epoch, verbose=0,
            callbacks=[curve.callback])
  return {**curve.figures(FLAGS.target_accuracy, config.minibatch),
          "model_bytes": 4 * model.count_params()}  # float32 weights


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
  figures = (train_to_accuracy(config) if FLAGS.target_accuracy > 0
             else train(config))
  write_task_figures(task_name, meter)
  if task["type"] == "chief":
    write_json("figures.json", figures)
    print(f"{FLAGS.strategy}: {figures}", flush=True)
  sys.stdout.flush()
  os._exit(0)  # the coordinator's threads can keep a process alive


if __name__ == "__main__":
  app.run(main)
