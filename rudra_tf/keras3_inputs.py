"""What a Keras 3 fit, evaluate or predict under RudraStrategy reads.

`LearnerInput` turns fit's `x, y, sample_weight` into one dataset function
per learner (`dataset_fn(input_context)`, for
`strategy.distribute_datasets_from_function`), the default number of steps,
the element spec that builds the model, and the one local dataset that
evaluate and predict read on the chief. Three kinds of input:

    kind        each learner reads                       steps_per_epoch
    ----        ------------------                       ---------------
    arrays      its 1/λ of the rows (row i: learner       ceil(rows / μ): the
                i mod λ), reshuffled at each pass,        rows once, over all
                repeated, in batches of μ = batch_size    learners
    dataset     the whole dataset, as given (as on        required
                TF's ParameterServerStrategy)
    function    fn(input_context): its own dataset        required

A learner's dataset must not end during fit (repeat it); batches of μ rows
are whole (repeated before batching), so every gradient averages μ rows.
"""

import math

import numpy as np
import tensorflow as tf

# Keras 3's batch size when fit or evaluate is given none.
DEFAULT_BATCH_SIZE = 32

ARRAYS = "arrays"
DATASET = "dataset"
FUNCTION = "function"


def _is_array(value):
  return isinstance(value, (np.ndarray, tf.Tensor)) or hasattr(
      value, "__array__")


def _rows(structure):
  return int(tf.nest.flatten(structure)[0].shape[0])


def class_weights_as_sample_weights(y, class_weight):
  """Each row's weight: class_weight of its class (an int label, or the
  index of a one-hot or probability row's largest entry)."""
  labels = np.asarray(y)
  if labels.ndim > 1 and labels.shape[-1] > 1:
    labels = np.argmax(labels, axis=-1)
  labels = labels.reshape(-1).astype(int)
  missing = sorted(set(labels.tolist()) - set(class_weight))
  if missing:
    raise ValueError(
        f"class_weight has no weight for classes {missing}; it gives "
        f"{sorted(class_weight)}.")
  return np.asarray([class_weight[label] for label in labels], "float32")


def split_for_validation(arrays, validation_split):
  """(training arrays, validation arrays): the last `validation_split` of
  the rows held out, as Keras splits them."""
  if not 0.0 < validation_split < 1.0:
    raise ValueError(
        f"validation_split must be in (0, 1); got {validation_split}.")
  rows = _rows(arrays)
  split_at = int(math.floor(rows * (1.0 - validation_split)))
  return (tf.nest.map_structure(lambda a: a[:split_at], arrays),
          tf.nest.map_structure(lambda a: a[split_at:], arrays))


class LearnerInput:
  """One fit/evaluate/predict input (see the module docstring)."""

  def __init__(self, x, y=None, sample_weight=None, batch_size=None,
               shuffle=True, class_weight=None, seed=0):
    self.batch_size = batch_size or DEFAULT_BATCH_SIZE
    self._shuffle = shuffle
    self._seed = seed
    if isinstance(x, tf.data.Dataset):
      self.kind = DATASET
    elif callable(x):
      self.kind = FUNCTION
    elif _is_array(x) or isinstance(x, (list, tuple, dict)):
      self.kind = ARRAYS
    else:
      raise ValueError(
          "fit, evaluate and predict under RudraStrategy take numpy arrays "
          "(or tensors), a tf.data.Dataset, or a dataset function "
          f"fn(tf.distribute.InputContext) -> Dataset; got {type(x)!r}.")
    if self.kind != ARRAYS:
      given = {"y": y, "sample_weight": sample_weight,
               "class_weight": class_weight, "batch_size": batch_size}
      extra = sorted(name for name, value in given.items()
                     if value is not None)
      if extra:
        raise ValueError(
            f"With a {self.kind} as x, give {', '.join(extra)} inside it "
            "(its elements are (x, y) or (x, y, sample_weight), batched); "
            "got them as arguments.")
      self._source = x
      return
    if class_weight is not None:
      if sample_weight is not None:
        raise ValueError("Give sample_weight or class_weight, not both.")
      sample_weight = class_weights_as_sample_weights(y, class_weight)
    arrays = tuple(part for part in (x, y, sample_weight) if part is not None)
    self._source = tf.nest.map_structure(np.asarray, arrays)
    self.rows = _rows(self._source)

  # ---------------------------------------------------------- the learners
  def default_steps(self):
    """Steps of one epoch when fit is given none (arrays only), else None."""
    if self.kind == ARRAYS:
      return max(1, math.ceil(self.rows / self.batch_size))
    return None

  def dataset_fn(self, input_context):
    """One learner's dataset (for distribute_datasets_from_function)."""
    if self.kind == DATASET:
      return self._source
    if self.kind == FUNCTION:
      return self._source(input_context)
    dataset = tf.data.Dataset.from_tensor_slices(self._source).shard(
        input_context.num_input_pipelines, input_context.input_pipeline_id)
    if self._shuffle:
      rows_here = math.ceil(self.rows / input_context.num_input_pipelines)
      dataset = dataset.shuffle(rows_here, seed=self._seed +
                                input_context.input_pipeline_id,
                                reshuffle_each_iteration=True)
    return dataset.repeat().batch(self.batch_size, drop_remainder=True)

  def element_spec(self):
    """The spec of one batch (builds the model; reads no data)."""
    if self.kind == ARRAYS:
      return tf.nest.map_structure(
          lambda a: tf.TensorSpec((None,) + a.shape[1:], tf.as_dtype(a.dtype)),
          self._source)
    if self.kind == DATASET:
      return self._source.element_spec
    context = tf.distribute.InputContext()
    traced = tf.function(lambda: self.dataset_fn(context))
    return traced.get_concrete_function().structured_outputs.element_spec

  # ------------------------------------------------------------- the chief
  def local_dataset(self, steps=None):
    """Evaluate's and predict's input on the chief: every row once, in
    order (arrays), or the dataset (or the function's, for one input
    pipeline); `steps` batches of it if given."""
    if self.kind == ARRAYS:
      dataset = tf.data.Dataset.from_tensor_slices(self._source).batch(
          self.batch_size)
    else:
      dataset = self.dataset_fn(tf.distribute.InputContext())
    if steps is not None:
      dataset = dataset.take(steps)
    return dataset
