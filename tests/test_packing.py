"""Packing tensors for one transfer per direction (rudra_tf/packing.py)."""

import numpy as np
import pytest
import tensorflow as tf

from rudra_tf import packing


def test_pack_concatenates_by_dtype_in_order_of_first_appearance():
  a = tf.constant([[1., 2., 3.], [4., 5., 6.]])  # float32, 6 values
  step = tf.constant(7, tf.int64)                   # int64, 1 value
  b = tf.constant([8., 9.])                         # float32, 2 values
  floats, ints = packing.pack([a, step, b])
  # Row-major flattening of a, then b; the int64 group on its own.
  np.testing.assert_array_equal(floats.numpy(), [1, 2, 3, 4, 5, 6, 8, 9])
  np.testing.assert_array_equal(ints.numpy(), [7])
  assert floats.dtype == tf.float32 and ints.dtype == tf.int64


def test_unpack_inverts_pack_with_shapes_and_dtypes_of_variables():
  variables = [tf.Variable(np.arange(24, dtype=np.float32).reshape(2, 3, 4)),
               tf.Variable(tf.zeros([0])),  # an empty tensor packs too
               tf.Variable(np.array([5, 6], np.int32)),
               tf.Variable(tf.constant(2.5))]  # a scalar
  packed = packing.pack([v.read_value() for v in variables])
  assert [p.shape.as_list() for p in packed] == [[25], [2]]
  unpacked = packing.unpack(packed, variables)
  for variable, tensor in zip(variables, unpacked):
    assert tensor.dtype == variable.dtype
    assert tensor.shape == variable.shape
    np.testing.assert_array_equal(tensor.numpy(), variable.numpy())


def test_a_single_tensor_is_only_reshaped():
  packed = packing.pack([tf.ones([3, 2])])
  assert len(packed) == 1 and packed[0].shape.as_list() == [6]
  (back,) = packing.unpack(packed, [tf.TensorSpec([3, 2], tf.float32)])
  np.testing.assert_array_equal(back.numpy(), np.ones([3, 2]))


def test_a_tensor_over_the_limit_crosses_alone():
  limit_elements = packing.PACK_LIMIT_BYTES // 4  # float32
  small = tf.constant([1., 2.])
  at_limit = tf.fill([limit_elements], 3.)      # exactly the limit: packed
  large = tf.fill([limit_elements + 1], 4.)     # one value more: alone
  tail = tf.constant([5.])
  packed = packing.pack([small, large, at_limit, tail])
  # First appearance: the float32 group (small), then large on its own.
  assert [p.shape.as_list() for p in packed] == [
      [2 + limit_elements + 1], [limit_elements + 1]]
  back = packing.unpack(packed, [small, large, at_limit, tail])
  for original, tensor in zip([small, large, at_limit, tail], back):
    np.testing.assert_array_equal(tensor.numpy(), original.numpy())


def test_pack_and_unpack_inside_a_function_keep_static_shapes():
  specs = [tf.TensorSpec([4, 5], tf.float32), tf.TensorSpec([5], tf.float32)]

  @tf.function(input_signature=specs)
  def round_trip(kernel, bias):
    unpacked = packing.unpack(packing.pack([kernel, bias]), specs)
    assert [t.shape.as_list() for t in unpacked] == [[4, 5], [5]]
    return unpacked

  kernel, bias = tf.random.normal([4, 5]), tf.random.normal([5])
  got_kernel, got_bias = round_trip(kernel, bias)
  np.testing.assert_array_equal(got_kernel.numpy(), kernel.numpy())
  np.testing.assert_array_equal(got_bias.numpy(), bias.numpy())


def test_bad_input_gets_a_clear_error():
  with pytest.raises(ValueError, match="at least one tensor"):
    packing.pack([])
  with pytest.raises(ValueError, match="unpack got 1 packed tensors for 2 "
                     "groups"):
    packing.unpack([tf.zeros([3])], [tf.TensorSpec([2], tf.float32),
                                     tf.TensorSpec([1], tf.int64)])

  @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
  def pack_unknown(values):
    return packing.pack([values])

  with pytest.raises(ValueError, match=r"unknown shape \(None,\)"):
    pack_unknown.get_concrete_function()


def test_a_push_decodes_to_what_was_encoded():
  # Two dense gradients (one float32 group), a row gradient of a [5, 2]
  # table (rows 1 and 3), and the metadata: 1 + 2 + 1 tensors cross.
  dense = [tf.constant([[1., 2.], [3., 4.]]), tf.constant([5.])]
  rows = tf.IndexedSlices(tf.constant([[6., 7.], [8., 9.]]),
                          tf.constant([1, 3], tf.int64))
  metadata = {"learner": tf.constant(2, tf.int64),
              "key": tf.constant(41, tf.int64)}
  sent = packing.encode_push(dense, [rows], metadata)
  assert len(sent) == 4
  np.testing.assert_array_equal(sent[-1].numpy(), [2, 41])
  got_dense, got_rows, got_metadata = packing.decode_push(
      sent, dense, [[5, 2]], list(metadata))
  for got, want in zip(got_dense, dense):
    np.testing.assert_array_equal(got.numpy(), want.numpy())
  row, = got_rows
  np.testing.assert_array_equal(row.values.numpy(), [[6., 7.], [8., 9.]])
  np.testing.assert_array_equal(row.indices.numpy(), [1, 3])
  np.testing.assert_array_equal(row.dense_shape.numpy(), [5, 2])
  assert {k: int(v) for k, v in got_metadata.items()} == {"learner": 2,
                                                          "key": 41}


def test_a_push_of_rows_alone_and_no_metadata():
  rows = tf.IndexedSlices(tf.constant([[1.]]), tf.constant([0], tf.int64))
  sent = packing.encode_push([], [rows], {})
  assert len(sent) == 2
  got_dense, got_rows, got_metadata = packing.decode_push(sent, [], [[3, 1]],
                                                          [])
  assert got_dense == [] and got_metadata == {}
  np.testing.assert_array_equal(got_rows[0].values.numpy(), [[1.]])
