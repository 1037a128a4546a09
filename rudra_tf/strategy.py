"""RudraStrategy: TensorFlow's parameter-server strategy with Rudra's protocols."""

import contextlib
import importlib
import os
import threading

from absl import logging
import tensorflow as tf

from rudra_tf import coordinator as coordinator_lib
from rudra_tf import protocol as protocol_lib
from rudra_tf import push_trace
from rudra_tf import report as report_lib
from rudra_tf import sparse
from rudra_tf import tf_hooks
from rudra_tf import variables as variables_lib
from rudra_tf.shard_state import ShardState

# tf_keras builds its evaluate/predict steps in these methods; their steps
# read the live weights without a pull (and never take a hardsync token).
_INFERENCE_STEP_BUILDERS = ("make_test_function", "_make_test_function_exact",
                            "make_predict_function")


# tf_keras makes its steps_per_execution counter in this Model method. Its
# data handler reads the counter on the chief before every scheduled closure
# (`DataHandler.steps()`: `.numpy()`), and no learner ever reads it (the
# multi-step train function gets its value as an argument): on a ps task
# each read is a blocking RPC that stalls the chief's scheduling loop.
_CHIEF_COUNTER_BUILDERS = ("_configure_steps_per_execution",)


def _is_inference_step(fn):
  return tf_hooks.is_step_of(fn, _INFERENCE_STEP_BUILDERS)


def _count_tasks(cluster_resolver, job):
  return len(cluster_resolver.cluster_spec().as_dict().get(job, ()))


class RudraExtended(tf_hooks.ParameterServerExtended):
  """ParameterServerStrategyV2Extended with Rudra's variables and update path.

  RudraStrategy swaps its `extended` object to this class after
  ParameterServerStrategy's constructor ran; it adds no state of its own.
  """

  def _create_var_creator(self, next_creator, **kwargs):
    kwargs.pop("aggregation", None)
    strategy = self._container_strategy()

    def rudra_variable_creator(**creator_kwargs):
      variable = variables_lib.RudraVariable(next_creator(**creator_kwargs))
      strategy._register_variable(variable)  # pylint: disable=protected-access
      return variable

    if self._num_replicas_in_sync > 1:
      raise ValueError(
          "RudraStrategy runs one replica per learner task, but each worker "
          f"has {self._num_replicas_in_sync} GPUs: give each learner task one "
          "GPU (CUDA_VISIBLE_DEVICES), as launch/train.py --gpus does.")
    return rudra_variable_creator

  def _create_variable(self, next_creator, **kwargs):
    if not tf_hooks.created_by_model_method(_CHIEF_COUNTER_BUILDERS):
      return super()._create_variable(next_creator, **kwargs)
    # On the chief (see _CHIEF_COUNTER_BUILDERS): a local read per closure
    # instead of an RPC to a ps. Stock ParameterServerStrategy pays that RPC
    # (about 5 ms a closure on a busy 2-core machine).
    with tf_hooks.colocated_with_nothing(), tf.device(
        tf_hooks.chief_cpu_device()):
      return self._create_var_creator(next_creator, **kwargs)(**kwargs)

  def _distribute_datasets_from_function(self, dataset_fn, options):
    learner = coordinator_lib.current_learner()
    if learner is None:
      return super()._distribute_datasets_from_function(dataset_fn, options)
    # Traced for one learner by RudraCoordinator: tell the dataset function
    # which of the λ input pipelines it is, so that it can read its shard.
    input_context = tf.distribute.InputContext(
        num_input_pipelines=self._container_strategy().num_learners,
        input_pipeline_id=learner,
        num_replicas_in_sync=self._num_replicas_in_sync)
    return tf_hooks.distributed_datasets_from_function(
        self, dataset_fn, options, input_context)

  def _update(self, var, fn, args, kwargs, group):
    # Keyed on the variable, not on the pull: tf_keras optimizers reach here
    # through merge_call, on the thread that called strategy.run, not on the
    # learner step's own thread.
    strategy = self._container_strategy()
    if not strategy._is_protocol_variable(var):  # pylint: disable=protected-access
      strategy._refuse_retired(var)  # pylint: disable=protected-access
      return super()._update(var, fn, args, kwargs, group)
    optimizer, kind = tf_hooks.optimizer_of_update(fn)
    step = _StepGradients.current()
    if optimizer is None or step is None:
      raise ValueError(
          f"Variable {var.name} is updated by the parameter-server "
          "protocol: only a tf_keras optimizer's apply_gradients inside a "
          "training step (model.fit, or strategy.run inside "
          "ClusterCoordinator.schedule) may change it (an eager "
          "strategy.run runs on the chief, which is no learner); this "
          f"update was {getattr(fn, '__qualname__', fn)!r}.")
    if kind == "gradient":
      step.add(strategy._implicit_wrapper(optimizer), args[0], var)  # pylint: disable=protected-access
    # kind == "weight_decay": applied with each update, on the shard.
    # As ParameterServerStrategy returns an update: ungrouped, one per
    # replica (legacy optimizers iterate over it).
    done = tf.no_op()
    return done if group else (done,)


class _StepGradients:
  """The gradients a plain tf_keras optimizer (not wrapped in a
  StalenessAwareOptimizer) applies in one learner step.

  tf_keras hands them to `RudraExtended._update` one variable at a time,
  on the thread that called `strategy.run`; gathered here, they are pushed
  as one gradient through the optimizer's implicit wrapper when the step's
  function returns (`RudraStrategy.run`).
  """

  _active = threading.local()

  def __init__(self):
    self.wrapper = None  # the implicit wrapper of the step's optimizer
    self.grads_and_vars = []

  @classmethod
  def current(cls):
    stack = getattr(cls._active, "stack", None)
    return stack[-1] if stack else None

  @contextlib.contextmanager
  def gathering(self):
    stack = self._active.__dict__.setdefault("stack", [])
    stack.append(self)
    try:
      yield self
    finally:
      stack.pop()

  def add(self, wrapper, gradient, variable):
    if self.wrapper is not None and self.wrapper is not wrapper:
      raise ValueError(
          "Two optimizers applied gradients in one training step; "
          "RudraStrategy pushes one gradient per learner step. Use one "
          "optimizer, or wrap each in a StalenessAwareOptimizer and call "
          "one per step.")
    if any(variable is v for _, v in self.grads_and_vars):
      raise ValueError(
          f"Variable {variable.name} received two gradients in one training "
          "step (apply_gradients called twice); RudraStrategy pushes one "
          "gradient per learner step.")
    self.wrapper = wrapper
    self.grads_and_vars.append((gradient, variable))

  def push(self):
    """Pushes the gathered gradients (graph code, in the learner step)."""
    if self.grads_and_vars:
      self.wrapper._push(self.grads_and_vars)  # pylint: disable=protected-access


class RudraStrategy(tf.distribute.experimental.ParameterServerStrategy):
  """Parameter-server training with Rudra's staleness-controlled protocols.

  Learners (the cluster's "worker" tasks, λ of them) pull the weights with
  their timestamp, compute a gradient on their own mini-batch and push it
  with that timestamp. Each parameter-server shard (a "ps" task holding
  trainable variables) keeps its own clock, computes each gradient's
  staleness σ = timestamp now - timestamp pulled, keeps a staleness histogram
  and aggregates gradients by protocol:

  * "hardsync": c = λ gradients, all computed on the same weights, make one
    update; a learner's next pull waits for that update, so σ is always 0.
  * "<n>-softsync": an update as soon as c = floor(λ/n) gradients arrived,
    from any learners, with no barrier. "1-softsync" has c = λ.
  * "async" (= "λ-softsync"): c = 1, each gradient is applied on arrival.
  * "<b>-backup-hardsync": hardsync with b backup learners (Chen et al.,
    arXiv 1604.00981; TF1's SyncReplicasOptimizer with
    replicas_to_aggregate = λ − b): each round takes the first c = λ − b
    gradients computed on its version, and a gradient that arrives after
    its version's round is dropped and counted (`dropped`; the accepted
    ones all have σ = 0). A late learner pulls the new version at once
    with the token it kept (barrier.py). A slow learner stops slowing the
    rounds; its gradients are spent.

  The learning-rate policy (α0, α0/n, α0/σ) belongs to
  `rudra_tf.StalenessAwareOptimizer`, which wraps the model's optimizer. A
  plain tf_keras optimizer (new or legacy), as stock ParameterServerStrategy
  code passes it, trains with lr_policy "none": its gradients are pushed
  through an implicit wrapper (see StalenessAwareOptimizer, "Unwrapped").

  Usage with tf_keras `model.fit`:

  ```python
  import tf_keras, rudra_tf
  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=4)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol="2-softsync")
  with strategy.scope():
    model = tf_keras.Sequential([
        tf_keras.layers.Input((784,)),
        tf_keras.layers.Dense(10, activation="softmax")])
    model.compile(
        optimizer=rudra_tf.StalenessAwareOptimizer(
            tf_keras.optimizers.SGD(0.01, momentum=0.9),
            lr_policy="divide_by_n"),
        loss="sparse_categorical_crossentropy", metrics=["accuracy"])
  model.fit(x, y, epochs=2, steps_per_epoch=50)
  print(strategy.staleness_report())
  ```

  In a deployment, pass
  `tf.distribute.cluster_resolver.TFConfigClusterResolver()` instead of the
  local cluster's resolver.

  Placement: model variables are spread round-robin over the ps tasks (or
  sharded by `variable_partitioner`); optimizer slots, gradient accumulators
  and the protocol state live next to the variables they belong to. The chief
  (coordinator) holds nothing a learner needs per step; it does hold
  tf_keras's steps_per_execution counter, which only the chief reads (before
  every scheduled closure: on a ps task that would be an RPC each time).

  Consistency: with `consistent_pulls=True` (the default) a pull reads a
  shard's weights and timestamp under the shard's lock, so they always belong
  to the same version. `consistent_pulls=False` reads without the lock:
  faster, but the weights may mix two versions (and then σ is approximate);
  async then also applies each update outside the shard's lock, like stock
  ParameterServerStrategy (the clock, σ and the counters stay exact).

  Embeddings (row gradients): an embedding lookup's gradient is pushed as
  the rows the mini-batch touched (deduplicated, as tf_keras does), and a
  shard adds it to its accumulator by a scatter; the update itself is the
  inner optimizer's (its sparse rule for async, its dense rule on the mean
  of c gradients otherwise). A lookup gathers its rows from the pulled
  snapshot, on the learner.

  Input: a dataset function (`tf_keras.utils.experimental.DatasetCreator`, or
  `distribute_datasets_from_function`) receives
  `InputContext(num_input_pipelines=λ, input_pipeline_id=learner index)`, so
  `dataset.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)` gives each
  learner its own disjoint shard. A plain tf.data dataset or numpy input is
  read whole by every learner.

  Push trace: `push_trace_dir` (a folder, made by the chief; in a
  deployment it must also exist on every ps host) makes each shard append a
  line per pull and per delivered push to `<dir>/shard<i>.trace`, in the
  order its lock served them (`rudra_tf.push_trace`: when each learner
  pulled and pushed, what it pulled and its σ). The simulator replays those
  step times (`simulate.SpeedModel.from_trace`). One small file write per
  pull and push on the ps: for studies, off by default.

  Limitations:
    * Shards are not synchronized with each other (as in Rudra): each shard
      has its own timestamp and histogram; `staleness_report()` gives each.
    * One replica per learner task (no multi-GPU learners).
    * Embedding tables: a pull copies every weight, a table included, so a
      step's cost grows with the table (docs/performance.md, "Embedding
      tables"). Row gradients are added to a dense accumulator (a table's
      size on the ps), and softsync/hardsync apply their mean densely.
    * evaluate and predict steps read the live weights without the lock.
    * hardsync's tokens are pooled (first come, first served, as TF1's
      SyncReplicasOptimizer's): a round takes the first c gradients of its
      version, all with σ = 0, but not necessarily one from each learner.
      A learner whose gradient is pending may pull the same version again
      while a token of it is unclaimed (a learner starting late or slow to
      come back, a dead learner's released token), and in backup rounds
      the gradient dropped as late may then be a fast learner's
      (barrier.py). Pooling is what lets a dead learner's re-run finish
      its round on another learner.
    * hardsync with several shards runs a barrier per shard; a learner
      takes its tokens in shard order, so the barriers cannot deadlock, but
      a learner may pull different versions of different shards.
    * Faults (docs/reliability.md): a learner that dies mid-closure has its
      closure re-run by TF; pushes its first run had delivered are refused
      (`staleness_report().duplicates`) when the closure's step count is
      known (tf_keras fit, or one `strategy.run` per scheduled function),
      and a dead hardsync learner's barrier token is released. A dead ps
      task loses its shard: resume from a checkpoint.
    * Mixed precision: `mixed_bfloat16` only; tf_keras refuses
      `mixed_float16` (loss scaling) under any parameter-server strategy.
    * Every learner's dataset must repeat (as under stock PSS); a learner
      whose data runs out fails with a `LearnerDataExhaustedError` (an
      OutOfRangeError, as on stock PSS) naming it.
    * A model may be built lazily (no Input): each scheduled function is
      first traced once without pulling (`coordinator.StepPlan`), where
      the model creates its variables; its steps then pull only if that
      trace pushed.
    * One strategy trains one model at a time, the newest: a model built
      after another one trained gets shards of its own (clocks, counters,
      report), and the earlier model's variables leave the protocol
      (evaluate and predict still read them; training that model again is
      refused, as is a trainable variable created while closures run).
    * A plain (unwrapped) optimizer trains with lr_policy "none"; its
      `iterations` count the pushes (as on stock PSS, where each push is
      an update), the shards' timestamps count the updates; its
      checkpoints hold its own variables, not the protocol state.
      Two optimizers, or two apply_gradients, in one step are refused.
    * An eager `strategy.run` (on the chief, outside any scheduled
      function) runs there, as on stock, but cannot train: the chief is no
      learner.
    * `model.save` (.keras, .h5) resumes inside a new RudraStrategy's scope
      with the optimizer's and shards' state; with a `variable_partitioner`
      tf_keras cannot write those formats (nor under stock PSS): export
      with `tf.saved_model.save` and resume from `tf.train.Checkpoint`.
    * One RudraStrategy (and one cluster) per process: TensorFlow connects a
      process to one cluster, and a second strategy was seen to hang.
    * On CPUs, start every task with TF_CPU_ALLOCATOR_USE_BFC=true (as
      `launch.train` does): with TensorFlow's default allocator a learner
      spent about a fifth of its CPU on fresh pages for each step's buffers
      (docs/performance.md, "Allocator").
  """

  def __init__(self, cluster_resolver, protocol="async", *,
               max_staleness=None, variable_partitioner=None,
               consistent_pulls=True, push_trace_dir=None):
    num_ps = _count_tasks(cluster_resolver, "ps")
    num_learners = _count_tasks(cluster_resolver, "worker")
    if num_ps < 1 or num_learners < 1:
      raise ValueError(
          "RudraStrategy needs a cluster with at least one 'ps' task and at "
          f"least one 'worker' (learner) task; this cluster has {num_ps} ps "
          f"and {num_learners} worker tasks: "
          f"{cluster_resolver.cluster_spec().as_dict()}.")
    self._protocol = protocol_lib.parse_protocol(protocol, num_learners)
    self._max_staleness = protocol_lib.validate_max_staleness(max_staleness)
    if not isinstance(consistent_pulls, bool):
      raise ValueError(
          f"consistent_pulls must be True or False, got {consistent_pulls!r}.")
    self._consistent_pulls = consistent_pulls
    if push_trace_dir is not None:
      if not isinstance(push_trace_dir, str) or not push_trace_dir:
        raise ValueError("push_trace_dir must be a folder path or None, got "
                         f"{push_trace_dir!r}.")
      os.makedirs(push_trace_dir, exist_ok=True)
    self._push_trace_dir = push_trace_dir
    self._trainable_variables = []
    self._retired_variables = []
    self._model_generation = 0
    self._shards = None
    self._implicit_wrappers = {}
    self._incarnations = [0] * num_learners
    super().__init__(cluster_resolver, variable_partitioner)
    tf_hooks.use_extended_class(self, RudraExtended)
    # The optimizer wrapper registers itself with tf_keras when imported: a
    # model saved with it then loads inside any RudraStrategy's scope. (It
    # uses the strategy's public surface; the strategy needs only this.)
    importlib.import_module("rudra_tf.optimizer")
    # Keras 3: its wrapper registers with Keras 3 the same way, and Keras
    # 3's fit, evaluate and predict of a model under this strategy run
    # through the coordinator (Keras 3 has no parameter-server training).
    importlib.import_module("rudra_tf.keras3_optimizer")
    importlib.import_module("rudra_tf.keras3_training").install()
    # Either Keras's compile refuses the other's optimizer as "could not
    # interpret"; this names both and the fix.
    tf_hooks.install_compile_check(importlib.import_module(
        "rudra_tf.shard_updates").refuse_mixed_compile)
    # ClusterCoordinator is one per strategy: tf_keras's fit then finds this.
    coordinator_lib.RudraCoordinator(self)

  # ------------------------------------------------------------- properties
  @property
  def protocol(self):
    """The parsed `rudra_tf.protocol.Protocol`."""
    return self._protocol

  @property
  def num_learners(self):
    return self._protocol.num_learners

  @property
  def max_staleness(self):
    return self._max_staleness

  @property
  def model_generation(self):
    """Which model this strategy trains: +1 each time a newer one is built
    (`_retire_trained_model`); a step traced for an earlier one is refused
    (RudraCoordinator.schedule)."""
    return self._model_generation

  def refuse_retired_model(self, generation):
    """Raises ValueError if `generation` (a step's, when it was traced) is
    not the model this strategy trains now."""
    if generation != self._model_generation:
      raise ValueError(
          "This training step belongs to a model this RudraStrategy "
          "trained before a newer one was created: one RudraStrategy trains "
          "one model at a time, the newest, and the earlier model's "
          "variables have left the protocol. Train the earlier model under "
          "a strategy of its own.")

  # ------------------------------------------------------------- variables
  def _register_variable(self, variable):
    # tf_keras creates its step counters as int64 variables that tf.Variable
    # marks trainable; only floating-point weights take part in the protocol.
    if variable.trainable and variable.dtype.is_floating:
      if self._shards is not None:
        self._retire_trained_model(variable)
      self._trainable_variables.append(variable)

  def _retire_trained_model(self, new_variable):
    """A new model: the trained one's variables leave the protocol.

    One strategy trains one model at a time, the newest: the shards (and
    their clocks, counters and barriers) were built for the variables that
    existed at the first step; a trainable variable created after that
    starts a new model, whose shards are built at its first step. The
    retired variables keep their values (evaluate and predict still read
    them), but no gradient reaches them any more: a push to one is refused
    (`_refuse_retired`). Refused while closures run: their shards would
    lose the strategy's fault handling mid-flight.
    """
    coordinator = tf_hooks.coordinator_of(self)
    if coordinator is not None and not coordinator.idle():
      raise ValueError(
          f"Trainable variable {new_variable.name} was created while this "
          "RudraStrategy's model trains; RudraStrategy needs every trainable "
          "variable to exist before the first step (build the model before "
          "fit), and starts a new model only when nothing runs.")
    self._retired_variables.extend(self._trainable_variables)
    self._trainable_variables = []
    self._shards = None
    self._implicit_wrappers = {}
    self._model_generation += 1

  def _is_protocol_variable(self, variable):
    return any(variable is v for v in self._trainable_variables)

  def _refuse_retired(self, variable):
    if any(variable is v for v in self._retired_variables):
      raise ValueError(
          f"Variable {variable.name} belongs to a model this RudraStrategy "
          "trained before a newer one was created (or was created after "
          "its model's training started): one RudraStrategy trains one "
          "model at a time, the newest, and each needs all its trainable "
          "variables before its first step. Train the earlier model under "
          "a strategy of its own, or build every layer before fit.")

  def _trace_path(self, shard_index):
    """Shard `shard_index`'s push trace file, or None (no trace)."""
    if self._push_trace_dir is None:
      return None
    return push_trace.trace_path(self._push_trace_dir, shard_index,
                                 self._model_generation)

  # ------------------------------------------- what the optimizer uses
  def build_shards(self):
    """The parameter-server shards (`ShardState`s), built on the first call.

    One per ps task holding trainable variables, in device order. Called
    by `StalenessAwareOptimizer.build` (the protocol state is built with the
    slots, so that a checkpoint restored before training restores it too)
    and by the first traced pull.
    """
    if self._shards is not None:
      return self._shards
    if not self._trainable_variables:
      raise ValueError(
          "RudraStrategy found no trainable variables: create and build the "
          "model inside strategy.scope() before training.")
    by_device = {}
    for variable in self._trainable_variables:
      by_device.setdefault(variable.device, []).append(variable)
    bins = protocol_lib.histogram_bins(self._protocol.num_learners)
    with self.state_scope():
      shards = [ShardState(self, index, device_variables, self._protocol, bins,
                           incarnations=list(self._incarnations),
                           trace_path=self._trace_path(index))
                for index, device_variables in
                enumerate(by_device[d] for d in sorted(by_device))]
      self._shards = shards
      self.restore_exact_rounds()
    return shards

  @contextlib.contextmanager
  def state_scope(self):
    """Where the shards' and the optimizer wrapper's state is created:
    eagerly, under this strategy's scope (a training step's first trace
    may call from inside a replica context, which already is)."""
    in_replica = tf.distribute.has_strategy() and \
        not tf.distribute.in_cross_replica_context()
    with tf.init_scope(), (
        contextlib.nullcontext() if in_replica else self.scope()):
      yield

  def push_gradients(self, grads_and_vars, pulled, apply_update, lr_policy,
                     correct=None):
    """Pushes one learner's gradients, shard by shard (graph code).

    Args:
      grads_and_vars: the learner's (gradient, variable) pairs.
      pulled: the step's `variables.PulledWeights`.
      apply_update: fn(list of (mean gradient, variable), timestamp): one
        update with the inner optimizer, run on the shard.
      lr_policy: the `protocol.LearningRatePolicy` (w(σ) on the shard).
      correct: None, or a compensation rule's fn(gradient, variable,
        θ_pulled, timestamp), run on the shard (`ShardState.push`): the
        pulled weights then travel with the gradients, and a row gradient
        travels dense.

    Returns:
      Each shard's staleness of this gradient (-1 for a refused duplicate).
    """
    per_shard, pulled_weights = {}, {}
    for gradient, variable in _split_sharded(grads_and_vars):
      shard = self._shard_of(variable)
      # A row gradient (an embedding lookup's) travels as its rows.
      gradient = (sparse.deduplicate(gradient)
                  if sparse.is_rows(gradient) and correct is None
                  else tf.convert_to_tensor(gradient))
      per_shard.setdefault(shard.index, []).append((gradient, variable))
      if correct is not None:
        pulled_weights.setdefault(shard.index, []).append(
            pulled.snapshots[id(variable)])
    staleness = []
    for shard in self._shards:
      if shard.index in per_shard:
        staleness.append(shard.push(
            per_shard[shard.index], pulled.timestamps[shard.index],
            apply_update, lr_policy, self._max_staleness,
            consistent=self._consistent_pulls, push_key=pulled.push_key,
            learner=pulled.learner, incarnation=pulled.incarnation,
            correct=correct, pulled_weights=pulled_weights.get(shard.index)))
    return staleness

  def restore_exact_rounds(self):
    """Hardsync: each shard's tokens recomputed from its pending gradients
    (`barrier.refill`), when no learner runs: after the shards are built
    and after their state is restored (chief side)."""
    for shard in self._shards or ():
      shard.refill_tokens()

  def _shard_of(self, variable):
    for shard in self._shards:
      if shard.owns(variable):
        return shard
    self._refuse_retired(variable)
    raise ValueError(
        f"Variable {variable.name} is not a trainable variable created under "
        "this RudraStrategy's scope.")

  # ------------------------------------------------------------ pull / push
  def run(self, fn, args=(), kwargs=None, options=None):
    """Runs `fn` on a learner; training steps see a pull of the weights.

    Called eagerly (on the chief, outside any scheduled function, as stock
    ParameterServerStrategy allows), `fn` runs there as on stock, without a
    pull; it cannot train, since the chief is no learner: an
    `apply_gradients` in it gets an error that says so. A `tf.function`
    passed as `fn` is traced into the learner's step, so that what it
    calls in replica context (a metric's `result()`) finds the replica
    context it would find on stock ParameterServerStrategy."""
    if _is_inference_step(fn) or tf.executing_eagerly():
      return super().run(fn, args, kwargs, options)
    if isinstance(fn, tf.types.experimental.PolymorphicFunction):
      fn = fn.python_function
    plan = coordinator_lib.current_step_plan()
    if plan is not None and not plan.probing and not plan.pushed:
      return super().run(fn, args, kwargs, options)  # trains nothing
    converted = tf_hooks.autograph_converted(fn)
    step_gradients = _StepGradients()
    if plan is not None and plan.probing:
      @tf.autograph.experimental.do_not_convert
      def probed_step(*step_args, **step_kwargs):
        with variables_lib.pull_scope(variables_lib.PulledWeights.probe(plan)):
          outputs = converted(*step_args, **step_kwargs)
          step_gradients.push()
          return outputs
      with step_gradients.gathering():
        return super().run(probed_step, args, kwargs, options)
    push_key = coordinator_lib.current_push_key()
    if push_key is not None and not tf_hooks.inside_autograph_trial():
      push_key.runs += 1
      push_key.in_loop |= tf_hooks.inside_while_loop()

    @tf.autograph.experimental.do_not_convert
    def pulled_step(*step_args, **step_kwargs):
      pulled = self._pull()
      pulled.push_key = push_key
      with variables_lib.pull_scope(pulled):
        outputs = converted(*step_args, **step_kwargs)
        step_gradients.push()
        return outputs

    with step_gradients.gathering():
      return super().run(pulled_step, args, kwargs, options)

  def _implicit_wrapper(self, optimizer):
    """The StalenessAwareOptimizer (lr_policy "none") that applies a plain
    tf_keras or Keras 3 optimizer's gradients: made at its first push, kept
    with the optimizer (whose slots and hyper-parameters it uses; the
    wrapper keeps it alive, so its id stays its own)."""
    key = id(optimizer)
    if key not in self._implicit_wrappers:
      optimizer_lib = importlib.import_module("rudra_tf.optimizer")
      if tf_hooks.is_keras3_optimizer(optimizer):
        # Its updates hand over tf.Variables; it was built on what the user
        # passed (a tf_keras optimizer fails on Keras 3 variables itself).
        importlib.import_module("rudra_tf.shard_updates").refuse_mixed_kerases(
            optimizer, tf_hooks.keras3_optimizer_built_on(optimizer))
      with tf.init_scope():
        self._implicit_wrappers[key] = optimizer_lib.StalenessAwareOptimizer(
            optimizer)
    return self._implicit_wrappers[key]

  def _pull(self):
    pulled = variables_lib.PulledWeights()
    pulled.learner = _current_learner()
    if self._protocol.barrier:
      pulled.incarnation = self._current_incarnation()
    # Hardsync: every learner takes its shard tokens in shard order. Taken
    # in any order, two learners could each hold the last token of a round
    # on a different shard and wait forever for the other's.
    taken = None
    for shard in self.build_shards():
      taken = shard.pull(pulled, consistent=self._consistent_pulls,
                         after=taken)
    return pulled

  def _current_incarnation(self):
    """The dispatching learner's incarnation (a call-time int64 tensor)."""
    incarnations = self._incarnations

    def at_dispatch():
      learner = tf_hooks.dispatching_worker_index()
      return 0 if learner is None else incarnations[learner]
    return tf_hooks.capture_at_dispatch(at_dispatch,
                                        tf.TensorSpec([], tf.int64))

  def _learner_failed(self, learner):
    """A new incarnation for a learner that died, and its hardsync tokens
    back (chief side, called by RudraCoordinator before TF re-queues the
    learner's closure and before the learner gets another: each shard must
    know the new incarnation by then, or it refuses that closure)."""
    self._incarnations[learner] += 1  # closures dispatched from now on
    if not self._protocol.barrier or self._shards is None:
      return
    for shard in self._shards:
      try:
        released = shard.release_learner(learner)
      except tf.errors.OpError as error:  # the ps is gone too: TF reports it
        logging.warning("could not release learner %d's tokens on shard %d:"
                        " %s", learner, shard.index, error)
        continue
      if released:
        logging.warning("learner %d failed holding %d hardsync token(s) of "
                        "shard %d; released them for the re-run", learner,
                        released, shard.index)

  def _pin_push_key(self, key):
    """Keeps closure `key`'s pushes counted until TF runs it again (chief
    side, called as TF puts the closure back; push_keys.py)."""
    for shard in self._shards or ():
      try:
        shard.pin_push_key(key)
      except tf.errors.OpError as error:  # the ps is gone: TF reports it
        logging.warning("could not pin push key %d on shard %d: %s", key,
                        shard.index, error)

  def _open_barriers(self):
    """Lets waiting hardsync pulls through while a failed fit's closures
    are cancelled (chief side); False once a ps cannot be reached."""
    for shard in self._shards or ():
      try:
        shard.open_barrier()
      except tf.errors.OpError as error:  # the ps is gone: TF reports it
        logging.warning("could not open shard %d's barrier: %s",
                        shard.index, error)
        return False
    return True

  def _restore_barriers_after_failure(self):
    """Exact hardsync rounds after a failed fit, before its next closure.

    TF's cancellation of the failed fit's closures may not reach the part
    of a step that runs on a ps: a pull still waiting there for a token
    would take one from the next fit's first round, which then never
    completes. Every learner first gets a new incarnation, as for a death
    (`_learner_failed`): such a leftover takes nothing, passes its wake-up
    on, and its push is refused.
    """
    for learner in range(len(self._incarnations)):
      self._incarnations[learner] += 1  # closures dispatched from now on
    for shard in self._shards or ():
      shard.retire_incarnations()
    self.restore_exact_rounds()

  # ----------------------------------------------------------------- report
  def staleness_report(self):
    """Reads every shard's counters (eagerly, under each shard's lock)."""
    bins = protocol_lib.histogram_bins(self._protocol.num_learners)
    if self._shards is None:
      return report_lib.StalenessReport.empty(self._protocol, bins)
    return report_lib.StalenessReport.from_shards(
        self._protocol, [shard.read_statistics() for shard in self._shards])


def _current_learner():
  """The index of the learner running this step (a call-time int64 tensor)."""
  return tf.distribute.coordinator.experimental_get_current_worker_index()


def _split_sharded(grads_and_vars):
  """Expands (gradient, ShardedVariable) pairs into per-part pairs, each
  with the strategy's own variable (no mixed-precision wrapper)."""
  for gradient, variable in grads_and_vars:
    # mixed_bfloat16 layers hand out an AutoCastVariable around the
    # strategy's variable; the gradient is that (float32) variable's.
    variable = tf_hooks.unwrap_autocast(variable)
    if isinstance(variable, tf_hooks.ShardedVariable):
      parts = variable.variables
      sizes = [part.shape[0] for part in parts]
      if sparse.is_rows(gradient):
        yield from zip(sparse.split_rows(gradient, sizes), parts)
      else:
        yield from zip(tf.split(tf.convert_to_tensor(gradient), sizes,
                                axis=0), parts)
    else:
      yield gradient, variable
