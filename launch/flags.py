"""The launch flags: one `define_flags()`, validated before any server starts."""

import dataclasses
import json
import os

from absl import flags

from rudra_tf import protocol as protocol_lib

DEFAULT_MINIBATCH = 32
TASK_TYPES = ("chief", "worker", "ps")


def define_flags():
  """Defines the flags of launch/train.py (and of each task it starts)."""
  flags.DEFINE_string("model", "small_cnn", "Model name (models.MODEL_NAMES).")
  flags.DEFINE_string("keras", "tf_keras", "The Keras the model is built and "
                      "trained with: tf_keras (the default, whose fit "
                      "TensorFlow's own parameter-server strategy runs) or "
                      "keras3 (Keras 3, import keras: its fit runs through "
                      "rudra_tf).")
  flags.DEFINE_string("dataset", "fashion_mnist",
                      "fashion_mnist | cifar10 | imagenet2012 | synthetic.")
  flags.DEFINE_string("data_dir", None, "Data folder (Fashion-MNIST IDX files "
                      "or the tensorflow-datasets data_dir).")
  flags.DEFINE_string("manual_dir", None, "ImageNet archives (tfds manual_dir).")
  flags.DEFINE_string("protocol", "2-softsync",
                      'hardsync | async | "<n>-softsync" with 1 <= n <= λ | '
                      '"<b>-backup-hardsync" with 1 <= b < λ (rounds of '
                      'the first λ − b gradients; late ones dropped).')
  flags.DEFINE_float("lr", 0.1, "Base learning rate α0 (SGD with momentum).")
  flags.DEFINE_float("momentum", 0.9, "SGD momentum.")
  flags.DEFINE_string("compensation", "none",
                      "Correction of each stale gradient on the ps "
                      "(rudra_tf/compensation.py): none | delay (DC-ASGD) | "
                      "delay_adaptive (DC-ASGD-a) | gap_aware.")
  flags.DEFINE_float("compensation_strength", None,
                     "λ_dc of --compensation=delay (default 0.04) or λ0 of "
                     "delay_adaptive (default 2.0); refused for the others.")
  flags.DEFINE_string("lr_policy", "divide_by_n",
                      "none | divide_by_n | divide_by_staleness.")
  flags.DEFINE_integer("learners", 4, "λ, the learners of a local cluster "
                       "(a TF_CONFIG cluster has its own worker count).")
  flags.DEFINE_integer("ps_tasks", 1, "Parameter-server tasks (local runs).")
  flags.DEFINE_integer("minibatch", None, "μ, examples per learner per step "
                       f"(default {DEFAULT_MINIBATCH}).")
  flags.DEFINE_integer("global_batch", None, "μλ: sets μ = global_batch / λ "
                       "(the paper's keep-μλ-constant rule).")
  flags.DEFINE_integer("epochs", 3, "Epochs.")
  flags.DEFINE_integer("steps_per_epoch", None, "Gradients per epoch (default: "
                       "one pass over the training split, train size / μ).")
  flags.DEFINE_integer("max_staleness", None, "Drop gradients staler than "
                       "this (default: keep all).")
  flags.DEFINE_string("checkpoint_dir", None, "Save each epoch; resume from "
                      "the latest checkpoint found here (also from the "
                      "middle of an epoch).")
  flags.DEFINE_integer("checkpoint_every_steps", None, "Also save inside "
                       "epochs, whenever this many more steps were trained "
                       "(needs --checkpoint_dir).")
  flags.DEFINE_float("checkpoint_every_secs", None, "Also save inside "
                     "epochs, when this many seconds passed since the last "
                     "save (needs --checkpoint_dir).")
  # absl.logging already defines --log_dir (for log files it writes only on
  # request); the same flag names where TensorBoard logs and the PNG go.
  if "log_dir" not in flags.FLAGS:
    flags.DEFINE_string("log_dir", None, "TensorBoard logs and the PNG plot.")
  flags.DEFINE_string("results", None, "Write the results JSON here.")
  flags.DEFINE_string("save_model", None, "Write the trained model here, "
                      "as a tf_keras .keras file that loads without rudra_tf "
                      "or a cluster (default: <log_dir>/model.keras when "
                      "--log_dir is set).")
  flags.DEFINE_integer("seed", 0, "Seed of the initial weights and shuffles.")
  flags.DEFINE_integer("gpus", 0, "GPUs on this machine: each learner gets "
                       "one, round-robin, of those CUDA_VISIBLE_DEVICES "
                       "lists (0: leave devices as they are). Refused when "
                       "TensorFlow sees fewer (pip install -e '.[gpu]').")
  flags.DEFINE_list("emulated_step_ms", [], "Emulated compute time per "
                    "learner step, in ms: one value for every learner or one "
                    "per learner (a straggler: 400,100,100,100). Learners "
                    "sleep instead of using CPU, so a machine with fewer "
                    "cores than learners can study equal or unequal speeds.")
  flags.DEFINE_string("push_trace_dir", None, "Write each ps shard's push "
                      "trace here (a line per pull and push: who, when, "
                      "which version, σ; rudra_tf/push_trace.py), for the "
                      "simulator's --speed=replay|measured.")
  flags.DEFINE_float("progress_every_s", 5.0, "Seconds between the progress "
                     "lines inside an epoch (step k of K, updates/s, "
                     "examples/s, staleness, time left); 0: none.")
  flags.DEFINE_integer("steps_per_execution", 1, "Gradients per scheduled "
                       "closure on a learner (amortizes scheduling).")
  flags.DEFINE_integer("learner_restarts", 3, "Local runs: how many times a "
                       "learner task that dies is restarted (it rejoins the "
                       "running job); 0 makes a dead learner end the job.")
  flags.DEFINE_list("kill_task", [], "Fault injection (local runs): "
                    "TYPE:INDEX@STEP kills that task with SIGKILL once the "
                    "parameter server has received STEP gradients, e.g. "
                    "worker:1@40 or ps:0@100 or chief:0@60; a killed "
                    "learner is awaited at the epoch's end until it serves "
                    "again. Repeatable.")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Validated settings of one training run."""
  model: str
  dataset: str
  data_dir: str
  manual_dir: str
  protocol: str
  lr: float
  momentum: float
  lr_policy: str
  num_learners: int
  num_ps: int
  minibatch: int
  epochs: int
  steps_per_epoch: int  # None: derived from the training split size
  max_staleness: int
  checkpoint_dir: str
  log_dir: str
  results: str
  seed: int
  gpus: int
  steps_per_execution: int
  emulated_step_ms: tuple = ()  # one value per learner, or ()
  learner_restarts: int = 3
  kill_tasks: tuple = ()  # (task type, index, step) entries
  save_model: str = None  # a .keras path, or None
  checkpoint_every_steps: int = None  # also save inside epochs
  checkpoint_every_secs: float = None
  progress_every_s: float = 5.0  # between in-epoch lines; 0: none
  keras: str = "tf_keras"  # or "keras3" (models.KERAS_NAMES)
  compensation: str = "none"  # compensation.COMPENSATIONS
  compensation_strength: float = None  # None: the rule's default
  push_trace_dir: str = None  # the shards' push traces, or None

  def learner_step_time_s(self, learner):
    """The emulated compute time of `learner`'s steps, in seconds."""
    return self.emulated_step_ms[learner] / 1000 if self.emulated_step_ms \
        else 0.0

  def as_dict(self):
    return dataclasses.asdict(self)


def _require(condition, message):
  if not condition:
    raise ValueError(message)


def resolve_minibatch(minibatch, global_batch, num_learners):
  """μ from --minibatch and --global_batch (which must agree)."""
  if global_batch is None:
    minibatch = DEFAULT_MINIBATCH if minibatch is None else minibatch
    _require(minibatch >= 1, f"--minibatch must be >= 1, got {minibatch}.")
    return minibatch
  _require(global_batch >= num_learners and global_batch % num_learners == 0,
           f"--global_batch={global_batch} must be a positive multiple of "
           f"λ={num_learners} (it sets μ = global_batch / λ).")
  derived = global_batch // num_learners
  _require(minibatch is None or minibatch == derived,
           f"--minibatch={minibatch} contradicts --global_batch="
           f"{global_batch} with λ={num_learners} (μ would be {derived}); "
           "give only one of them.")
  return derived


def resolve_step_times(values_ms, num_learners):
  """--emulated_step_ms as one float per learner (or () when not given)."""
  if not values_ms:
    return ()
  try:
    times = [float(v) for v in values_ms]
  except ValueError:
    raise ValueError(f"--emulated_step_ms={','.join(values_ms)} must be "
                     "numbers (milliseconds).") from None
  _require(len(times) in (1, num_learners),
           f"--emulated_step_ms has {len(times)} values; give one for every "
           f"learner or one per learner (λ={num_learners}).")
  _require(all(t >= 0 for t in times), "--emulated_step_ms values must be "
           f">= 0, got {','.join(values_ms)}.")
  return tuple(times * num_learners if len(times) == 1 else times)


def resolve_kill_tasks(entries, num_learners, num_ps):
  """--kill_task entries as (type, index, step) tuples."""
  sizes = {"chief": 1, "worker": num_learners, "ps": num_ps}
  plan = []
  for entry in entries:
    task, _, step = entry.partition("@")
    task_type, _, index = task.partition(":")
    _require(task_type in sizes and index.isdigit() and step.isdigit(),
             f"--kill_task={entry!r} must look like TYPE:INDEX@STEP with TYPE "
             "one of chief, worker, ps (e.g. worker:1@40).")
    _require(int(index) < sizes[task_type], f"--kill_task={entry!r}: there is "
             f"no {task_type}:{index} (this cluster has {sizes[task_type]} "
             f"{task_type} task(s)).")
    _require(int(step) >= 1, f"--kill_task={entry!r}: STEP must be >= 1.")
    plan.append((task_type, int(index), int(step)))
  return tuple(plan)


def resolve_config(values, num_learners, num_ps):
  """Checks every flag; raises ValueError naming the bad value and the fix."""
  from models import KERAS_NAMES, MODEL_NAMES  # pylint: disable=g-import-not-at-top
  from rudra_tf import dataset_sources  # pylint: disable=g-import-not-at-top
  _require(values.model in MODEL_NAMES, f"--model={values.model!r} is "
           f"unknown; valid models are {', '.join(MODEL_NAMES)}.")
  _require(values.keras in KERAS_NAMES, f"--keras={values.keras!r} is "
           f"unknown; valid values are {', '.join(KERAS_NAMES)}.")
  names = dataset_sources.DATASET_NAMES
  _require(values.dataset in names, f"--dataset={values.dataset!r} "
           f"is unknown; valid datasets are {', '.join(names)}.")
  _require(num_learners >= 1, f"--learners must be >= 1, got {num_learners}.")
  _require(num_ps >= 1, f"--ps_tasks must be >= 1, got {num_ps}.")
  protocol_lib.parse_protocol(values.protocol, num_learners)
  protocol_lib.validate_lr_policy(values.lr_policy)
  rule = _checked_compensation(values.compensation,
                               values.compensation_strength)
  _require(values.lr > 0, f"--lr must be > 0, got {values.lr}.")
  _require(0 <= values.momentum < 1,
           f"--momentum must be in [0, 1), got {values.momentum}.")
  _require(values.epochs >= 1, f"--epochs must be >= 1, got {values.epochs}.")
  _require(values.steps_per_epoch is None or values.steps_per_epoch >= 1,
           f"--steps_per_epoch must be >= 1, got {values.steps_per_epoch}.")
  _require(values.steps_per_execution >= 1, "--steps_per_execution must be "
           f">= 1, got {values.steps_per_execution}.")
  _require(values.gpus >= 0, f"--gpus must be >= 0, got {values.gpus}.")
  _require(values.learner_restarts >= 0, "--learner_restarts must be >= 0, "
           f"got {values.learner_restarts}.")
  protocol_lib.validate_max_staleness(values.max_staleness)
  _require(values.progress_every_s >= 0, "--progress_every_s must be >= 0 "
           f"(0: no in-epoch lines), got {values.progress_every_s}.")
  for name in ("checkpoint_every_steps", "checkpoint_every_secs"):
    value = getattr(values, name)
    _require(value is None or value > 0, f"--{name} must be > 0, got "
             f"{value}.")
    _require(value is None or values.checkpoint_dir, f"--{name}={value} "
             "needs --checkpoint_dir (where the checkpoints go).")
  minibatch = resolve_minibatch(values.minibatch, values.global_batch,
                                num_learners)
  if values.dataset == "fashion_mnist":
    directory = dataset_sources.fashion_mnist_dir(values.data_dir)
    missing = [f for f in dataset_sources.FASHION_MNIST_FILES.values()
               if not os.path.exists(os.path.join(directory, f))]
    _require(not missing, f"Fashion-MNIST files missing in {directory}: "
             f"{', '.join(missing)}; install them with `apt-get install "
             "dataset-fashion-mnist` or pass --data_dir.")
  return TrainConfig(
      model=values.model, dataset=values.dataset, data_dir=values.data_dir,
      manual_dir=values.manual_dir, protocol=values.protocol, lr=values.lr,
      momentum=values.momentum, lr_policy=values.lr_policy,
      num_learners=num_learners, num_ps=num_ps, minibatch=minibatch,
      epochs=values.epochs, steps_per_epoch=values.steps_per_epoch,
      max_staleness=values.max_staleness,
      checkpoint_dir=values.checkpoint_dir, log_dir=values.log_dir or None,
      results=values.results, seed=values.seed, gpus=values.gpus,
      steps_per_execution=values.steps_per_execution,
      emulated_step_ms=resolve_step_times(
          values.emulated_step_ms, num_learners),
      learner_restarts=values.learner_restarts,
      kill_tasks=resolve_kill_tasks(values.kill_task, num_learners, num_ps),
      save_model=resolve_save_model(values.save_model, values.log_dir),
      checkpoint_every_steps=values.checkpoint_every_steps,
      checkpoint_every_secs=values.checkpoint_every_secs,
      progress_every_s=values.progress_every_s, keras=values.keras,
      compensation=rule.name, compensation_strength=rule.strength,
      push_trace_dir=values.push_trace_dir or None)


def _checked_compensation(name, strength):
  """The --compensation rule, or ValueError in the flags' words."""
  from rudra_tf import compensation  # pylint: disable=g-import-not-at-top
  try:
    return compensation.Compensation.create(name, strength)
  except ValueError as error:
    raise ValueError(f"--compensation={name!r} "
                     f"--compensation_strength={strength!r}: {error}") from None


def resolve_save_model(path, log_dir):
  """The .keras path the chief writes the trained model to, or None."""
  if path is None:
    return os.path.join(log_dir, "model.keras") if log_dir else None
  _require(path.endswith(".keras"), f"--save_model={path!r} must end in "
           "'.keras' (the Keras format; it loads without rudra_tf).")
  _require(not os.path.isdir(path), f"--save_model={path!r} is a folder; "
           "give a file path ending in '.keras'.")
  return path


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  cluster: dict
  task_type: str
  task_index: int

  @property
  def address(self):
    return self.cluster[self.task_type][self.task_index]


def parse_tf_config(text):
  """Parses TF_CONFIG; raises ValueError with a one-line reason."""
  try:
    config = json.loads(text)
  except json.JSONDecodeError as error:
    raise ValueError(f"TF_CONFIG is not valid JSON ({error}); expected "
                     '{"cluster": {...}, "task": {"type": ..., "index": ...}}.'
                     ) from None
  _require(isinstance(config, dict) and isinstance(config.get("cluster"), dict),
           'TF_CONFIG needs a "cluster" object mapping job names to address '
           "lists.")
  cluster = config["cluster"]
  for job, addresses in cluster.items():
    _require(job in TASK_TYPES, f"TF_CONFIG cluster has unknown job {job!r}; "
             f"valid jobs are {', '.join(TASK_TYPES)}.")
    _require(isinstance(addresses, list) and addresses and all(
        isinstance(a, str) and a.rpartition(":")[2].isdigit()
        for a in addresses), f"TF_CONFIG job {job!r} needs a non-empty list "
             f'of "host:port" strings, got {addresses!r}.')
  for job in TASK_TYPES:
    _require(job in cluster, f"TF_CONFIG cluster has no {job!r} job; a "
             "RudraStrategy cluster needs a chief, workers and ps tasks.")
  _require(len(cluster["chief"]) == 1, "TF_CONFIG needs exactly one chief, "
           f"got {len(cluster['chief'])}.")
  task = config.get("task")
  _require(isinstance(task, dict) and "type" in task,
           'TF_CONFIG needs a "task": {"type": ..., "index": ...} entry.')
  _require(task["type"] in TASK_TYPES, f"TF_CONFIG task type "
           f"{task['type']!r} is unknown; valid types are "
           f"{', '.join(TASK_TYPES)}.")
  index = task.get("index", 0)
  _require(isinstance(index, int) and 0 <= index < len(cluster[task["type"]]),
           f"TF_CONFIG task index {index!r} is out of range for job "
           f"{task['type']!r} with {len(cluster[task['type']])} tasks.")
  return TaskSpec(cluster, task["type"], index)
