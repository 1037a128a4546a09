"""Packs many tensors into one flat tensor per dtype, so that they cross once.

Every tensor that crosses between a learner and a ps task inside a training
step is a transfer of its own (a Send/Recv pair: one RPC). A pull of a
shard's 8 variables was 8 transfers and the push of their gradients 8 more,
each with a fixed cost (the RPC, its serialization, a thread wake-up) that
dominates for small tensors. Packed, a pull is one transfer and a push two
(gradients, and the push's int64 metadata).

    flat = pack([a, b])            # a: [2, 3] float32, b: [4] float32
    a2, b2 = unpack(flat, [a, b])  # flat: one [10] float32 tensor

Packing is a reshape and one concat (a copy of the bytes, far cheaper than
an RPC); unpacking is a split and reshapes.
"""

import tensorflow as tf


def _groups(specs):
  """Indices of `specs` grouped by dtype, in order of first appearance."""
  groups = {}
  for index, spec in enumerate(specs):
    groups.setdefault(tf.as_dtype(spec.dtype), []).append(index)
  return list(groups.values())


def _num_elements(spec):
  count = tf.TensorShape(spec.shape).num_elements()
  if count is None:
    raise ValueError(f"Cannot pack a tensor of unknown shape {spec.shape}; "
                     "every packed tensor needs a fully defined shape.")
  return count


def pack(tensors):
  """Flattens `tensors` and concatenates those of one dtype.

  Args:
    tensors: a non-empty list of tensors with fully defined shapes.

  Returns:
    A list of 1-D tensors, one per dtype, in order of first appearance.
  """
  if not tensors:
    raise ValueError("pack needs at least one tensor, got none.")
  packed = []
  for indices in _groups(tensors):
    for index in indices:
      _num_elements(tensors[index])
    flat = [tf.reshape(tensors[index], [-1]) for index in indices]
    packed.append(flat[0] if len(flat) == 1 else tf.concat(flat, axis=0))
  return packed


def unpack(packed, like):
  """The inverse of `pack`.

  Args:
    packed: `pack`'s result.
    like: what was packed, or anything with the same `shape` and `dtype`
      attributes in the same order (variables, `tf.TensorSpec`s).

  Returns:
    A list of tensors shaped and ordered like `like`.
  """
  groups = _groups(like)
  if len(packed) != len(groups):
    raise ValueError(f"unpack got {len(packed)} packed tensors for "
                     f"{len(groups)} dtypes.")
  tensors = [None] * len(like)
  for flat, indices in zip(packed, groups):
    sizes = [_num_elements(like[index]) for index in indices]
    parts = [flat] if len(indices) == 1 else tf.split(flat, sizes, axis=0)
    for index, part in zip(indices, parts):
      tensors[index] = tf.reshape(part, like[index].shape)
  return tensors
