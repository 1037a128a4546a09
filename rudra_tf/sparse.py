"""Row gradients (`tf.IndexedSlices`) on their way from a learner to a shard.

An embedding lookup's gradient names the rows a mini-batch touched: a few
hundred rows of a table that may hold millions. A learner pushes it as
those rows (values and indices), never as the whole table, and a shard adds
it to its accumulator with a scatter; only the update itself (the mean of c
gradients, or the async update) is written the inner optimizer's way.

Two pure transformations, on the learner, before the push:

* `deduplicate`: a row looked up twice in one batch appears twice in the
  gradient. tf_keras sums such duplicates before any update (an Adam second
  moment of two half-gradients is not that of their sum); so do we, which
  also sends each row once.

      values [[1], [2], [4]], indices [3, 0, 3] -> values [[5], [2]],
                                                  indices [3, 0]

* `split_rows`: a table partitioned over ps tasks (`variable_partitioner`)
  is a `ShardedVariable` of parts holding consecutive rows; each part's
  gradient is the rows that fall in it, renumbered from the part's start.

      parts of 3 and 2 rows; indices [4, 1, 3] ->
      part 0: indices [1] (row 1); part 1: indices [1, 0] (rows 4, 3)
"""

import tensorflow as tf


def is_rows(gradient):
  """True for a row gradient (`tf.IndexedSlices`)."""
  return isinstance(gradient, tf.IndexedSlices)


def deduplicate(gradient):
  """Sums the values of repeated indices (first appearance order kept)."""
  unique, positions = tf.unique(gradient.indices)
  values = tf.math.unsorted_segment_sum(gradient.values, positions,
                                        tf.shape(unique)[0])
  return tf.IndexedSlices(values, unique, gradient.dense_shape)


def split_rows(gradient, part_rows):
  """Splits a row gradient of a table among its parts of `part_rows` rows.

  Returns one `tf.IndexedSlices` per part, whose indices count from the
  part's first row (a part no row falls in gets an empty gradient).
  """
  parts = []
  start = 0
  indices = tf.cast(gradient.indices, tf.int64)
  for rows in part_rows:
    inside = tf.reshape(tf.where((indices >= start) & (indices < start + rows)),
                        [-1])
    dense_shape = None
    if gradient.dense_shape is not None:
      dense_shape = tf.concat([[rows], tf.cast(gradient.dense_shape[1:],
                                               tf.int64)], axis=0)
    parts.append(tf.IndexedSlices(tf.gather(gradient.values, inside),
                                  tf.gather(indices, inside) - start,
                                  dense_shape))
    start += rows
  return parts


def weighted(weight, gradient):
  """weight * gradient, for a dense or a row gradient."""
  if is_rows(gradient):
    return tf.IndexedSlices(tf.cast(weight, gradient.values.dtype) *
                            gradient.values, gradient.indices,
                            gradient.dense_shape)
  return tf.cast(weight, gradient.dtype) * gradient


def add_to(accumulator, gradient):
  """accumulator += gradient (a scatter for a row gradient)."""
  if is_rows(gradient):
    return accumulator.scatter_add(gradient)
  return accumulator.assign_add(gradient)


def tensors_of(gradient):
  """The tensors a gradient is made of (for control dependencies)."""
  if is_rows(gradient):
    return [gradient.values, gradient.indices]
  return [gradient]
