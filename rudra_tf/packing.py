"""Packs small tensors into one flat tensor per dtype, so that they cross once.

Every tensor that crosses between a learner and a ps task inside a training
step is a transfer of its own (a Send/Recv pair: one RPC). A pull of a
shard's 8 variables was 8 transfers and the push of their gradients 8 more,
each with a fixed cost (the RPC, its serialization, a thread wake-up) that
dominates for small tensors. Packed, a pull is one transfer and a push two
(gradients, and the push's int64 metadata).

    flat = pack([a, b])            # a: [2, 3] float32, b: [4] float32
    a2, b2 = unpack(flat, [a, b])  # flat: one [10] float32 tensor

Packing is a reshape and one concat (a copy of the bytes, far cheaper than
an RPC for small tensors); unpacking is a split and reshapes. A tensor over
`PACK_LIMIT_BYTES` crosses alone: for it the RPC's fixed cost is small next
to its bytes, and packing would copy it on both sides (measured with the
ps-capacity benchmark, packing everything lowered pushes/s at 10 and 100 MB
models and doubled the ps task's peak memory at 100 MB).
"""

import tensorflow as tf

# 1 MiB: copying it costs about what one RPC's fixed cost does on a CPU.
PACK_LIMIT_BYTES = 1 << 20


def _groups(specs):
  """Indices of `specs` to send together, in order of first appearance.

  Tensors of one dtype up to PACK_LIMIT_BYTES form one group; a larger
  tensor is a group of its own.
  """
  groups = {}
  for index, spec in enumerate(specs):
    dtype = tf.as_dtype(spec.dtype)
    if _num_elements(spec) * dtype.size > PACK_LIMIT_BYTES:
      groups[("alone", index)] = [index]
    else:
      groups.setdefault(dtype, []).append(index)
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
    A list of 1-D tensors: one per dtype of the tensors up to
    PACK_LIMIT_BYTES, and one per larger tensor, in order of first
    appearance.
  """
  if not tensors:
    raise ValueError("pack needs at least one tensor, got none.")
  packed = []
  for indices in _groups(tensors):
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
                     f"{len(groups)} groups (dtypes and large tensors).")
  tensors = [None] * len(like)
  for flat, indices in zip(packed, groups):
    sizes = [_num_elements(like[index]) for index in indices]
    parts = [flat] if len(indices) == 1 else tf.split(flat, sizes, axis=0)
    for index, part in zip(indices, parts):
      tensors[index] = tf.reshape(part, like[index].shape)
  return tensors


def encode_push(dense_gradients, row_gradients, metadata):
  """The tensors one push sends to a ps, packed on the learner.

  In order: the dense gradients, packed (`pack`); each row gradient's
  values and indices (their count varies by batch, so they cross as they
  are); the int64 metadata as one vector, omitted when empty.

  Args:
    dense_gradients: a list of tensors with fully defined shapes.
    row_gradients: a list of `tf.IndexedSlices`.
    metadata: a dict of int64 scalars (name -> tensor), in a fixed order.
  """
  sent = pack(dense_gradients) if dense_gradients else []
  for gradient in row_gradients:
    sent += [gradient.values, gradient.indices]
  if metadata:
    sent.append(tf.stack([tf.cast(value, tf.int64)
                          for value in metadata.values()]))
  return sent


def decode_push(arrived, dense_like, row_shapes, metadata_names):
  """The inverse of `encode_push`, where its tensors arrived (the ps).

  Args:
    arrived: `encode_push`'s tensors.
    dense_like: shapes and dtypes of the dense gradients (`unpack`'s like).
    row_shapes: the dense shape of each row gradient's variable.
    metadata_names: the metadata's names, in `encode_push`'s order.

  Returns:
    (dense gradients, row gradients as `tf.IndexedSlices`, metadata dict).
  """
  num_packed = len(_groups(dense_like))
  dense = unpack(arrived[:num_packed], dense_like) if dense_like else []
  rows = [tf.IndexedSlices(arrived[num_packed + 2 * i],
                           arrived[num_packed + 2 * i + 1],
                           tf.constant(list(shape), tf.int64))
          for i, shape in enumerate(row_shapes)]
  metadata = (dict(zip(metadata_names, tf.unstack(arrived[-1])))
              if metadata_names else {})
  return dense, rows, metadata
