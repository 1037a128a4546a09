r"""Trains a model with RudraStrategy: one command, local or on a real cluster.

With no TF_CONFIG in the environment it starts a local cluster of separate
OS processes on 127.0.0.1 (ps tasks, λ learners, a chief), streams every
task's log with a `[type:index]` prefix and stops them all at the end:

  python -m launch.train --model=small_cnn --dataset=fashion_mnist \
      --learners=4 --ps_tasks=1 --protocol=2-softsync --lr_policy=divide_by_n

With TF_CONFIG set (a real deployment, see docs/deploy.md) the same command
runs one task: "ps" and "worker" tasks serve until the chief is done, then
exit 0; the "chief" trains, evaluates on the test split and writes results.
"""

import math
import os
import re
import socket
import sys
import time

from launch import tf_environment

# Before anything imports TensorFlow: here and in every task this process
# starts (they inherit the environment).
tf_environment.apply_defaults()

from absl import app
from absl import flags
from absl import logging

from launch import checkpoints
from launch import flags as launch_flags
from launch import gpus
from launch import local_cluster
from launch import ps_watchdog

launch_flags.define_flags()
FLAGS = flags.FLAGS

# A ps or worker task waits this long for the chief to appear, and exits
# once the chief's host refused its port for CHIEF_GONE_CHECKS checks in a
# row (the chief finished). A chief that does not answer at all is a
# network fault, not an end: the task keeps serving (the chief's
# coordinator takes it back once the network does) and gives up after
# CHIEF_UNREACHABLE_TIMEOUT_S without an answer.
CHIEF_WAIT_TIMEOUT_S = 900
CHIEF_GONE_CHECKS = 3
CHIEF_UNREACHABLE_TIMEOUT_S = 900
# The chief waits this long for every ps and worker port to open.
CLUSTER_WAIT_TIMEOUT_S = 300


def _fail(message):
  print(f"error: {message}", file=sys.stderr, flush=True)
  return 2


def _port_in_use(address):
  host, port = address.rsplit(":", 1)
  bind_host = "" if host not in ("127.0.0.1", "localhost") else host
  with socket.socket() as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind((bind_host, int(port)))
    except OSError:
      return True
  return False


def serve(spec):
  """Runs a ps or worker server until the chief has come and gone."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.distribute.Server(tf.train.ClusterSpec(spec.cluster),
                       job_name=spec.task_type, task_index=spec.task_index,
                       protocol="grpc", start=True)
  print(f"{spec.task_type}:{spec.task_index} serving on {spec.address}",
        flush=True)
  if os.environ.get(tf_environment.PRINT_DEVICES_VARIABLE):
    print(f"{spec.task_type}:{spec.task_index} CUDA_VISIBLE_DEVICES="
          f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r} GPUs="
          f"{[d.name for d in tf.config.list_logical_devices('GPU')]}",
          flush=True)
  chief = spec.cluster["chief"][0]
  seen, refusals = False, 0
  started = last_answer = time.monotonic()
  while True:
    found = local_cluster.probe_port(chief)
    now = time.monotonic()
    if found != local_cluster.PORT_UNREACHABLE:
      last_answer = now
    if found == local_cluster.PORT_OPEN:
      seen, refusals = True, 0
    elif seen and found == local_cluster.PORT_REFUSED:
      refusals += 1
      if refusals >= CHIEF_GONE_CHECKS:
        print("chief finished; exiting", flush=True)
        return 0
    elif seen and now - last_answer > CHIEF_UNREACHABLE_TIMEOUT_S:
      print(f"error: chief {chief} unreachable for "
            f"{CHIEF_UNREACHABLE_TIMEOUT_S} s; exiting", flush=True)
      return 1
    elif not seen and now - started > CHIEF_WAIT_TIMEOUT_S:
      print(f"error: chief {chief} never appeared", flush=True)
      return 1
    time.sleep(1)


def _wait_for_cluster(cluster):
  deadline = time.monotonic() + CLUSTER_WAIT_TIMEOUT_S
  for job in ("ps", "worker"):
    for index, address in enumerate(cluster[job]):
      while not local_cluster.port_open(address):
        if time.monotonic() > deadline:
          raise RuntimeError(f"{job}:{index} at {address} is not reachable "
                             f"after {CLUSTER_WAIT_TIMEOUT_S} s")
        time.sleep(0.5)


class CheckpointUnusableError(RuntimeError):
  """The checkpoint to resume from cannot be read into this model."""


class ParameterServerLostError(RuntimeError):
  """A ps task became unreachable during training (its state is lost)."""

  def __init__(self, tasks):
    super().__init__(
        f"parameter-server task {', '.join(tasks) or '(unknown)'} became "
        "unreachable during training; run the same command again with the "
        "same --checkpoint_dir to resume from the last checkpoint.")


def _exit_on_lost_ps(tasks):
  """The ps watchdog's verdict: a ps host stopped answering. The chief's
  own RPCs to it wait without a deadline, so it exits from here, with the
  code of a lost ps task (3) and the same message."""
  _fail(str(ParameterServerLostError(tasks)))
  sys.stdout.flush()
  os._exit(3)  # pylint: disable=protected-access


def _lost_ps_tasks(error):
  """The ps tasks an UnavailableError names, as ["ps:0", ...]."""
  found = sorted(set(re.findall(r"/job:ps/replica:\d+/task:(\d+)",
                                str(error))), key=int)
  return [f"ps:{index}" for index in found]


def run_chief(config, spec):
  """Trains, evaluates on the test split, writes results; returns them."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import models  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  from launch import telemetry  # pylint: disable=g-import-not-at-top
  from rudra_tf import checkpointing  # pylint: disable=g-import-not-at-top
  from rudra_tf import datasets  # pylint: disable=g-import-not-at-top

  keras = models.keras_module(config.keras)  # tf_keras or Keras 3
  keras.utils.set_random_seed(config.seed)
  data = datasets.load_dataset(config.dataset, config.data_dir,
                               config.manual_dir)
  steps_per_epoch = config.steps_per_epoch or math.ceil(
      data.train_size / config.minibatch)
  print(f"{config.dataset}: {data.train_size} training / {data.test_size} "
        f"test examples; λ={config.num_learners} learners, μ="
        f"{config.minibatch}, {config.protocol}, lr_policy={config.lr_policy},"
        f"{_compensation_text(config)} {steps_per_epoch} gradients per epoch; "
        f"{config.model} with "
        f"{config.keras}", flush=True)
  _wait_for_cluster(spec.cluster)
  if os.environ.get(tf_environment.PRINT_DEVICES_VARIABLE):
    # Before the strategy connects: the learners' contexts take it from here.
    tf.debugging.set_log_device_placement(True)
  strategy = rudra_tf.RudraStrategy(
      tf.distribute.cluster_resolver.TFConfigClusterResolver(),
      protocol=config.protocol, max_staleness=config.max_staleness,
      push_trace_dir=config.push_trace_dir)
  if os.environ.get(tf_environment.PRINT_DEVICES_VARIABLE):
    print(f"learner steps run on {strategy.extended.worker_devices} of each "
          "worker task", flush=True)
  with strategy.scope():
    model = models.build_model(config.model, data.input_shape,
                               data.num_classes, keras=config.keras)
    optimizer = rudra_tf.StalenessAwareOptimizer(
        keras.optimizers.SGD(config.lr, momentum=config.momentum),
        lr_policy=config.lr_policy, compensation=config.compensation,
        compensation_strength=config.compensation_strength)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"],
                  steps_per_execution=config.steps_per_execution)
  callbacks = []
  steps_done = 0
  if config.checkpoint_dir:
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, config.checkpoint_dir,
                                         max_to_keep=3)
    if manager.latest_checkpoint:
      try:
        steps_done = checkpointing.steps_done(manager.latest_checkpoint)
        checkpoint.restore(
            manager.latest_checkpoint).assert_existing_objects_matched()
      except Exception as error:  # pylint: disable=broad-except
        # A truncated file surfaces as IndexError, a bad one as an OpError,
        # a model mismatch as AssertionError/ValueError: all mean "unusable".
        raise CheckpointUnusableError(
            f"cannot resume from {manager.latest_checkpoint}: "
            f"{str(error).splitlines()[0][:300]}; it is corrupt or from "
            "another model. Nothing was changed; use another "
            "--checkpoint_dir.") from None
      optimizer.build(model.trainable_variables)
      epoch, step = checkpointing.position(steps_done, steps_per_epoch)
      where = (f"after epoch {epoch}" if not step else
               f"in epoch {epoch + 1}, after step {step} of "
               f"{steps_per_epoch}")
      print(f"resumed from {manager.latest_checkpoint} {where}", flush=True)
    checkpoints.record_run(config)
    callbacks.append(checkpointing.PeriodicCheckpoint(
        manager, every_steps=config.checkpoint_every_steps,
        every_secs=config.checkpoint_every_secs, initial_steps=steps_done,
        out=lambda line: print(line, flush=True)))
  if config.kill_tasks:
    from launch import faults  # pylint: disable=g-import-not-at-top
    callbacks.append(faults.KillTaskAtStep(
        strategy, config.kill_tasks, spec.cluster,
        out=lambda line: print(line, flush=True)))
  progress = telemetry.ProgressCallback(
      strategy, config.minibatch, config.epochs, log_dir=config.log_dir,
      out=lambda line: print(line, flush=True),
      progress_every_s=config.progress_every_s)
  # Each learner's data goes on after the batches it has trained on (its
  # gradient count, restored with a checkpoint): a resumed run continues
  # every learner's stream instead of starting it again.
  trained_batches = [0] * config.num_learners
  def learner_dataset(context):
    return datasets.with_step_time(
        data.learner_dataset(context, config.minibatch, seed=config.seed)
        .skip(trained_batches[context.input_pipeline_id]),
        config.learner_step_time_s(context.input_pipeline_id))
  # tf_keras's fit takes a dataset function as a DatasetCreator; Keras 3's
  # under RudraStrategy (rudra_tf/keras3_training.py) as it is.
  creator = (keras.utils.experimental.DatasetCreator(learner_dataset)
             if config.keras == "tf_keras" else learner_dataset)
  start = time.monotonic()
  watchdog = ps_watchdog.PsWatchdog(
      spec.cluster["ps"], on_lost=_exit_on_lost_ps).start()
  try:
    for segment in checkpointing.fit_segments(steps_done, config.epochs,
                                              steps_per_epoch):
      trained_batches[:] = strategy.staleness_report().learner_gradients
      model.fit(creator, verbose=0, callbacks=[progress] + callbacks,
                **segment)
      if model.stop_training:
        break
  except (tf.errors.UnavailableError, tf.errors.AbortedError) as error:
    raise ParameterServerLostError(_lost_ps_tasks(error)) from error
  finally:
    watchdog.stop()
    progress.close()  # no in-epoch lines after a failed fit
  wall_time_s = time.monotonic() - start

  # Exact test accuracy on the whole test split, on the chief.
  local_model = models.build_model(config.model, data.input_shape,
                                   data.num_classes, keras=config.keras)
  local_model.set_weights(model.get_weights())
  # Compiled with the run's inner optimizer, so that the saved model
  # fine-tunes as it was trained.
  local_model.compile(
      optimizer=keras.optimizers.SGD(config.lr, momentum=config.momentum),
      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
  test_loss, test_accuracy = local_model.evaluate(data.test_dataset(1000),
                                                  verbose=0)
  if config.save_model:
    # The strategy-free copy: it loads anywhere, with no rudra_tf or cluster
    # (keras.models.load_model for --keras=keras3, tf_keras's otherwise).
    os.makedirs(os.path.dirname(os.path.abspath(config.save_model)),
                exist_ok=True)
    local_model.save(config.save_model)
  report = strategy.staleness_report()
  last = int(np.max(np.nonzero(report.histogram)[0], initial=0))
  results = {
      "config": config.as_dict(), "steps_per_epoch": steps_per_epoch,
      "epochs": progress.rows, "test_accuracy": float(test_accuracy),
      "test_loss": float(test_loss), "wall_time_s": wall_time_s,
      "updates": report.timestamp, "gradients": report.gradients,
      "dropped": report.dropped, "pending": report.pending,
      "duplicates": report.duplicates,
      "learner_gradients": report.learner_gradients.tolist(),
      "gradients_per_update": report.gradients_per_update,
      "staleness_mean": report.mean, "staleness_max": report.max,
      "staleness_histogram": report.histogram[:last + 1].tolist(),
      "model_path": config.save_model,
      "diverged_at_epoch": progress.diverged_epoch,
  }
  print(f"test accuracy {test_accuracy:.4f} (loss {test_loss:.4f}) | "
        f"wall time {wall_time_s:.1f} s", flush=True)
  print(f"updates {report.timestamp} | gradients {report.gradients} "
        f"received, {report.dropped} dropped, {report.pending} pending, "
        f"{report.duplicates} duplicate pushes refused", flush=True)
  print(f"staleness mean {report.mean:.3f} max {report.max} histogram "
        f"{results['staleness_histogram']}", flush=True)
  results_path = config.results or (
      os.path.join(config.log_dir, "results.json") if config.log_dir else None)
  if results_path:
    telemetry.write_results(results_path, results)
    print(f"results: {results_path}", flush=True)
  if config.log_dir:
    plot_path = os.path.join(config.log_dir, "run.png")
    telemetry.plot_run(
        plot_path, progress.rows, test_accuracy, wall_time_s,
        report.histogram,
        f"{config.model} on {config.dataset}: {config.protocol}, "
        f"λ={config.num_learners}, μ={config.minibatch}, {config.lr_policy}")
    print(f"plot: {plot_path}", flush=True)
  if config.save_model:
    print(f"model: {config.save_model}", flush=True)
  return results


def _compensation_text(config):
  """", compensation=delay (0.04)," or "" when none."""
  if config.compensation == "none":
    return ""
  strength = ("" if config.compensation_strength is None
              else f" ({config.compensation_strength:g})")
  return f" compensation={config.compensation}{strength},"


def main(argv):
  del argv
  # TensorFlow's coordinator logs every closure batch at INFO.
  logging.set_verbosity(logging.WARNING)
  tf_config = os.environ.get("TF_CONFIG", "").strip()
  try:
    if tf_config:
      spec = launch_flags.parse_tf_config(tf_config)
      config = launch_flags.resolve_config(
          FLAGS, len(spec.cluster["worker"]), len(spec.cluster["ps"]))
    else:
      config = launch_flags.resolve_config(FLAGS, FLAGS.learners,
                                           FLAGS.ps_tasks)
      gpus.check_gpus(config.gpus, os.environ)
    checkpoints.check_resumable(config)
  except ValueError as error:
    return _fail(str(error))

  if not tf_config:
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        p for p in (repo_root, environment.get("PYTHONPATH")) if p)
    cluster = local_cluster.LocalProcessCluster(
        [sys.executable, "-m", "launch.train"] + sys.argv[1:],
        num_learners=config.num_learners, num_ps=config.num_ps,
        gpus=config.gpus, environment=environment,
        learner_restarts=config.learner_restarts)
    try:
      code = cluster.run()
      if code == 2:  # the chief already said what was wrong with the input
        return code
      if code:
        resume = (" with the same --checkpoint_dir to resume from the last "
                  "checkpoint" if config.checkpoint_dir else "")
        _fail(f"the chief exited with code {code}; stopped every task. Run "
              f"the same command again{resume}.")
      return code
    except local_cluster.TaskFailedError as error:
      return _fail(f"{error}; stopped every task.")
    except KeyboardInterrupt:
      print("interrupted; stopped every task.", file=sys.stderr, flush=True)
      return 130

  # A task of the local launcher's own cluster has the supervisor's pid file.
  in_local_cluster = bool(
      os.environ.get(local_cluster.PIDS_ENVIRONMENT_VARIABLE))
  if config.kill_tasks and not in_local_cluster:
    return _fail("--kill_task works only in a local cluster started by "
                 "launch/train.py without TF_CONFIG; remove it for a deploy.")
  if config.gpus and not in_local_cluster:
    return _fail(f"--gpus={config.gpus} works only in a local cluster started "
                 "by launch/train.py without TF_CONFIG; in a deploy, remove "
                 "it and give each learner task one GPU with "
                 "CUDA_VISIBLE_DEVICES (docs/deploy.md, section 5).")
  if spec.task_type in ("ps", "worker"):
    if _port_in_use(spec.address):
      return _fail(f"port of {spec.task_type}:{spec.task_index} "
                   f"({spec.address}) is already in use; free it or change "
                   "TF_CONFIG.")
    return serve(spec)
  # Exit codes: 0 done, 2 unusable checkpoint (bad input), 3 ps task lost.
  code = 0
  try:
    run_chief(config, spec)
  except CheckpointUnusableError as error:
    code = _fail(str(error))
  except ParameterServerLostError as error:
    _fail(str(error))
    code = 3
  # The coordinator's threads can keep a finished process alive.
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


_HELP_FLAGS = ("--help", "-?", "--helpshort", "--helpfull")


def run():
  """The console entry point (`rudra-train`) and `python -m launch.train`."""
  # The flags live in launch/flags.py, which absl's short help leaves out;
  # show them all, and exit 0 for a help request (absl exits 1).
  wants_help = any(arg in _HELP_FLAGS for arg in sys.argv[1:])
  argv = ["--helpfull" if arg in _HELP_FLAGS else arg for arg in sys.argv]
  try:
    app.run(main, argv=argv)
  except SystemExit as done:
    if wants_help and done.code == 1:
      sys.exit(0)
    raise


if __name__ == "__main__":
  run()
