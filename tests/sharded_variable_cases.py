"""tf_keras 2.21's sharded-variable parameter-server tests, ported: each case
as tf_keras writes it, run under whichever strategy kind the caller names.

The source: tf_keras/distribute/sharded_variable_test.py (v2.21.0),
ShardedVariableTest and ShardedVariableMixedPartitioningTest. The port
changes what a port must: absltest assertions become plain ones (numpy's
for the array ones), tf_keras's private module paths become public names
(`tf_keras.layers.Layer` for `base_layer.Layer`), parameterized cases become
one case per combination, and the clusters are made by the caller: one
in-process cluster of 2 learners and 3 ps tasks (the originals make one of
3 workers and 2 ps, and another of 3 and 3 for three shards). The strategy
lines are the only other difference: `t.strategy(shards)` gives stock
ParameterServerStrategy or RudraStrategy with the original's
FixedShardsPartitioner, made once per shard count and shared by the cases
(as the original shares its 2-shard one), and
`t.strategy_with_partitioner` a new one with the given partitioner. `distribution` of
test_saved_model_load_non_pss takes the CPU members of tf_keras's
`strategies_minus_tpu` (default, one-device, mirrored on one CPU).

`run_cases(kind)` runs every case on one cluster, one after another, and
returns each case's outcome: "pass", or the error's type and message.
tests/test_compatibility.py runs it in fresh processes; `python -m
benchmarks.compatibility` prints it with tf_keras's other PS tests.
"""

import tempfile

import numpy as np

from tests import compatibility_cases

CASES = {}


def case(fn):
  CASES[fn.__name__] = fn
  return fn


class _Test:
  """What the originals' test class gives a case: its strategies (made with
  the caller's kind on the caller's cluster) and temporary directories."""

  def __init__(self, kind, resolver, temp_dir):
    self._kind = kind
    self._resolver = resolver
    self._temp_dir = temp_dir
    self._by_partitioner = {}

  def strategy(self, shards=2):
    """The setUpClass strategy (2 fixed shards), or one with `shards`."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if shards not in self._by_partitioner:
      self._by_partitioner[shards] = compatibility_cases.make_strategy(
          self._kind, self._resolver,
          variable_partitioner=(
              tf.distribute.experimental.partitioners.FixedShardsPartitioner(
                  shards)))
    return self._by_partitioner[shards]

  def strategy_with_partitioner(self, partitioner):
    return compatibility_cases.make_strategy(
        self._kind, self._resolver, variable_partitioner=partitioner)

  def get_temp_dir(self):
    return tempfile.mkdtemp(dir=self._temp_dir)


def _assert_list_all_equal(list1, list2):
  for lhs, rhs in zip(list1, list2):
    assert lhs == rhs, (lhs, rhs)


def _check_layer_weights(layer, trainable, non_trainable):
  assert len(layer.trainable_weights) == 2
  np.testing.assert_array_equal(layer.trainable_weights[0], [trainable[0]])
  np.testing.assert_array_equal(layer.trainable_weights[1], [trainable[1]])
  assert len(layer.non_trainable_weights) == 2
  np.testing.assert_array_equal(layer.non_trainable_weights[0],
                                [non_trainable[0]])
  np.testing.assert_array_equal(layer.non_trainable_weights[1],
                                [non_trainable[1]])
  _assert_list_all_equal(
      layer.weights, layer.trainable_weights + layer.non_trainable_weights)
  _assert_list_all_equal(layer.trainable_weights, layer.trainable_variables)
  _assert_list_all_equal(layer.weights, layer.variables)
  checkpoint_deps = set(layer._trackable_children().values())  # pylint: disable=protected-access
  assert checkpoint_deps == set([layer.w, layer.b])


@case
def keras_layer_setattr(t):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top

  class Layer(tf_keras.layers.Layer):

    def __init__(self):
      super().__init__()
      self.w = tf.Variable([0, 1])
      self.b = tf.Variable([2, 3], trainable=False)

  with t.strategy().scope():
    layer = Layer()
  _check_layer_weights(layer, [0, 1], [2, 3])


@case
def keras_layer_add_weight(t):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top

  class Layer(tf_keras.layers.Layer):

    def __init__(self):
      super().__init__()
      self.w = self.add_weight(
          shape=(2,), initializer=lambda shape, dtype: tf.constant([0.0, 1.0]),
          trainable=True)
      self.b = self.add_weight(
          shape=(2,), initializer=lambda shape, dtype: tf.constant([2.0, 3.0]),
          trainable=False)

  with t.strategy().scope():
    layer = Layer()
  _check_layer_weights(layer, [0.0, 1.0], [2.0, 3.0])


@case
def keras_metrics(t):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  with t.strategy().scope():
    fp = tf_keras.metrics.FalsePositives(thresholds=[0.2, 0.5, 0.7, 0.8])
    auc = tf_keras.metrics.AUC(num_thresholds=10)

  @tf.function
  def update():
    fp.update_state([0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.3, 0.9])
    auc.update_state([0, 0, 1, 1], [0, 0.5, 0.3, 0.9])

  @tf.function
  def reset():
    fp.reset_state()
    auc.reset_state()

  update()
  assert auc.result() == 0.75
  np.testing.assert_array_equal(fp.result(), [2.0, 1.0, 1.0, 1.0])
  reset()
  assert auc.result() == 0.0
  np.testing.assert_array_equal(fp.result(), [0.0, 0.0, 0.0, 0.0])
  assert hasattr(auc.true_positives, "variables")
  assert hasattr(fp.accumulator, "variables")


def _create_model(model_type):
  import tf_keras  # pylint: disable=g-import-not-at-top
  inputs = tf_keras.layers.Input(shape=(6,))
  if model_type == "dense":
    outputs = tf_keras.layers.Dense(6)(inputs)
  else:
    outputs = tf_keras.layers.Embedding(output_dim=2, input_dim=6)(inputs)
  model = tf_keras.Model(inputs, outputs)
  model.compile(optimizer="adam", loss="mean_squared_error")
  return model


def _flat(weights):
  return np.concatenate([w.flatten() for w in weights])


def saved_model_combined(t, shard_config, model_type):
  """test_saved_model_combined: save with shard_config[0] shards per
  variable, load into shard_config[1] (1: the default strategy)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top

  def strategy_for(shards):
    return t.strategy(shards) if shards > 1 else tf.distribute.get_strategy()

  strategy = strategy_for(shard_config[0])
  x = tf.cast(tf.expand_dims(tf.range(6), 0), tf.float32)
  with strategy.scope():
    model = _create_model(model_type)
    expect = model(x)
  n_expected_variables = shard_config[0] * (2 if model_type == "dense" else 1)
  assert len(model.variables) == n_expected_variables
  model_weights = [v.numpy() for v in model.variables]
  saved_dir = t.get_temp_dir()
  model.save(saved_dir)

  strategy2 = strategy_for(shard_config[1])
  with strategy2.scope():
    loaded_model = tf_keras.models.load_model(saved_dir)
    got = loaded_model(x)
    np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-6)
    n_expected_variables = shard_config[1] * (
        2 if model_type == "dense" else 1)
    assert len(loaded_model.variables) == n_expected_variables
    loaded_model_weights = [v.numpy() for v in loaded_model.variables]
    np.testing.assert_allclose(_flat(model_weights),
                               _flat(loaded_model_weights), rtol=1e-6,
                               atol=1e-6)


for _config in ([2, 2], [2, 3], [3, 2], [2, 1], [1, 1], [1, 2], [1, 3]):
  for _model_type in ("dense", "embedding"):
    CASES[f"saved_model_combined[shard_config={_config},"
          f"model_type={_model_type}]"] = (
              lambda t, c=_config, m=_model_type: saved_model_combined(t, c, m))


def _non_pss_distribution(name):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if name == "default":
    return tf.distribute.get_strategy()
  if name == "one_device_cpu":
    return tf.distribute.OneDeviceStrategy("/cpu:0")
  return tf.distribute.MirroredStrategy(["/cpu:0"])


def saved_model_load_non_pss(t, model_type, distribution):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  x = tf.cast(tf.expand_dims(tf.range(6), 0), tf.float32)
  with t.strategy().scope():
    model = _create_model(model_type)
    expect = model(x)
  model_weights = [v.numpy() for v in model.variables]
  saved_dir = t.get_temp_dir()
  model.save(saved_dir)

  with _non_pss_distribution(distribution).scope():
    loaded_model = tf_keras.models.load_model(saved_dir)
    got = loaded_model(x)
    np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-6)
    n_expected_variables = 2 if model_type == "dense" else 1
    assert len(loaded_model.variables) == n_expected_variables
    loaded_model_weights = [v.numpy() for v in loaded_model.variables]
    np.testing.assert_allclose(_flat(model_weights),
                               _flat(loaded_model_weights), rtol=1e-6,
                               atol=1e-6)


for _distribution in ("default", "one_device_cpu", "mirrored_with_one_cpu"):
  for _model_type in ("dense", "embedding"):
    CASES[f"saved_model_load_non_pss[model_type={_model_type},"
          f"distribution={_distribution}]"] = (
              lambda t, m=_model_type, d=_distribution:
              saved_model_load_non_pss(t, m, d))


def _slot_variable_setup(strategy):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  with strategy.scope():
    # Set a name so the ShardedVariable is well-named for slot var keying.
    var = tf.Variable([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], name="test")
  opt = tf_keras.optimizers.legacy.Adam()

  def train_step():
    with tf.GradientTape() as tape:
      loss = sum(var)
    opt.minimize(loss, var.variables, tape=tape)

  return var, opt, train_step


@case
def slot_variable_checkpointing(t):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy = t.strategy()
  var, opt, train_step = _slot_variable_setup(strategy)
  # Run once to trigger apply_gradients to populate optimizer slot variables.
  strategy.run(train_step)

  def slots():
    values = []
    for slot in opt.get_slot_names():
      values.extend([v.numpy() for v in opt.get_slot(var, slot)])
    return values

  pre_ckpt_slots = slots()
  ckpt = tf.train.Checkpoint(var=var, opt=opt)
  # The checkpoint has slots for each shard and the ShardedVariable.
  assert len(ckpt.opt._slots) == 3  # pylint: disable=protected-access
  for var_name in ckpt.opt._slots.keys():  # pylint: disable=protected-access
    var_slots = ckpt.opt._slots[var_name]  # pylint: disable=protected-access
    assert len(var_slots) == 2
    assert var_slots.keys() == {"m", "v"}
    if hasattr(var_slots["m"], "variables"):
      assert len(var_slots["m"].variables) == 2
      assert len(var_slots["v"].variables) == 2
  saved_dir = t.get_temp_dir()
  ckpt.save(f"{saved_dir}/ckpt")
  # Once more to alter the slots; the checkpoint restores the earlier ones.
  strategy.run(train_step)
  assert not np.allclose(pre_ckpt_slots, slots())
  ckpt.restore(tf.train.latest_checkpoint(saved_dir))
  np.testing.assert_allclose(pre_ckpt_slots, slots())


@case
def slot_variable_checkpoint_load_with_diff_shards(t):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy = t.strategy()
  var, opt, train_step = _slot_variable_setup(strategy)
  strategy.run(train_step)

  def slots(opt, var):
    values = []
    for slot in opt.get_slot_names():
      values.extend(tf.concat(list(opt.get_slot(var, slot)), axis=0).numpy())
    return values

  pre_ckpt_slots = slots(opt, var)
  ckpt = tf.train.Checkpoint(var=var, opt=opt)
  saved_dir = t.get_temp_dir()
  ckpt.save(f"{saved_dir}/ckpt")

  # A new strategy with a different number of shards, and a new variable
  # with different values, to be overwritten by the checkpoint.
  strategy2 = t.strategy(3)
  var, opt, train_step = _slot_variable_setup(strategy2)
  strategy2.run(train_step)
  new_ckpt = tf.train.Checkpoint(var=var, opt=opt)
  new_ckpt.restore(tf.train.latest_checkpoint(saved_dir))
  np.testing.assert_allclose(pre_ckpt_slots, slots(new_ckpt.opt, var))


@case
def saved_model_min_size_partitioner(t):
  """ShardedVariableMixedPartitioningTest.test_saved_model_min_size_partitioner."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  partitioners = tf.distribute.experimental.partitioners
  # min_shard_bytes such that the Dense kernel is split into 2, the bias 1.
  strategy = t.strategy_with_partitioner(partitioners.MinSizePartitioner(
      min_shard_bytes=(6 * 6 * 4) // 2, max_shards=2))
  x = tf.cast(tf.expand_dims(tf.range(6), 0), tf.float32)
  with strategy.scope():
    model = _create_model("dense")
    expect = model(x)
  assert len(model.variables) == 3  # 2 kernel variables, 1 bias
  saved_dir = t.get_temp_dir()
  model.save(saved_dir)
  # Now the kernel into 3, the bias 1.
  strategy2 = t.strategy_with_partitioner(partitioners.MinSizePartitioner(
      min_shard_bytes=(6 * 6 * 4) // 3, max_shards=3))
  with strategy2.scope():
    loaded_model = tf_keras.models.load_model(saved_dir)
    got = loaded_model(x)
    np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-6)
    assert len(loaded_model.variables) == 4  # 3 kernel variables, 1 bias


def run_cases(kind, names=None):
  """Every case (or `names`) on one cluster (2 learners, 3 ps) under
  strategy `kind`; returns {case: "pass" or "<ErrorType>: <message>"}."""
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=3, num_learners=2)
  outcomes = {}
  with tempfile.TemporaryDirectory() as temp_dir:
    test = _Test(kind, cluster.resolver, temp_dir)
    for name in names or CASES:
      try:
        CASES[name](test)
        outcomes[name] = "pass"
      except Exception as error:  # pylint: disable=broad-except
        outcomes[name] = compatibility_cases.outcome_of(error)
  return outcomes


# The cases RudraStrategy refuses, with the error it gives (README, "What is
# refused"): they train inside an eager strategy.run on the chief, which is
# no learner; no update is applied.
REFUSED_UNDER_RUDRA = {
    "slot_variable_checkpointing": "which is no learner",
    "slot_variable_checkpoint_load_with_diff_shards": "which is no learner",
}
