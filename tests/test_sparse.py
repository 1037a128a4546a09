"""Row gradients on the learner (rudra_tf/sparse.py), worked by hand."""

import numpy as np
import tensorflow as tf

from rudra_tf import sparse


def _rows(values, indices, rows):
  values = np.asarray(values, np.float32)
  return tf.IndexedSlices(tf.constant(values), tf.constant(indices, tf.int64),
                          tf.constant([rows, values.shape[1]], tf.int64))


def test_deduplicate_sums_repeated_rows_in_first_appearance_order():
  # Row 3 twice: [1] + [4] = [5]; row 0 once.
  unique = sparse.deduplicate(_rows([[1.], [2.], [4.]], [3, 0, 3], 5))
  np.testing.assert_array_equal(unique.indices.numpy(), [3, 0])
  np.testing.assert_array_equal(unique.values.numpy(), [[5.], [2.]])
  np.testing.assert_array_equal(unique.dense_shape.numpy(), [5, 1])


def test_deduplicate_keeps_the_dense_equivalent():
  gradient = _rows(np.arange(12).reshape(6, 2), [1, 4, 1, 0, 4, 4], 5)
  np.testing.assert_array_equal(
      tf.convert_to_tensor(sparse.deduplicate(gradient)).numpy(),
      tf.convert_to_tensor(gradient).numpy())


def test_split_rows_renumbers_each_part_from_its_first_row():
  # Parts of 3 and 2 rows: rows 0-2 and 3-4. Rows 4 and 3 fall in part 1 as
  # its rows 1 and 0; row 1 in part 0.
  first, second = sparse.split_rows(
      _rows([[10.], [20.], [30.]], [4, 1, 3], 5), [3, 2])
  np.testing.assert_array_equal(first.indices.numpy(), [1])
  np.testing.assert_array_equal(first.values.numpy(), [[20.]])
  np.testing.assert_array_equal(first.dense_shape.numpy(), [3, 1])
  np.testing.assert_array_equal(second.indices.numpy(), [1, 0])
  np.testing.assert_array_equal(second.values.numpy(), [[10.], [30.]])
  np.testing.assert_array_equal(second.dense_shape.numpy(), [2, 1])


def test_split_rows_gives_an_empty_gradient_to_a_part_not_looked_up():
  first, second = sparse.split_rows(_rows([[1., 2.]], [0], 4), [2, 2])
  assert first.values.shape == (1, 2)
  assert second.values.shape == (0, 2) and second.indices.shape == (0,)


def test_weighted_and_add_to_act_on_rows_only():
  accumulator = tf.Variable(tf.zeros([4, 1]))
  sparse.add_to(accumulator, sparse.weighted(0.5, _rows([[2.], [4.]],
                                                        [3, 1], 4)))
  sparse.add_to(accumulator, sparse.weighted(2.0, tf.ones([4, 1])))
  # Rows 3 and 1 get 0.5 * 2 = 1 and 0.5 * 4 = 2; then every row + 2.
  np.testing.assert_array_equal(accumulator.numpy(), [[2.], [4.], [2.], [3.]])
