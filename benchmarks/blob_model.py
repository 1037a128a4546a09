"""A model that is all parameters and almost no compute: for ps capacity.

`blob_model(megabytes)` holds `megabytes` of float32 weights in PARTS
variables (spread round-robin over the ps tasks) and computes next to
nothing with them: the loss adds each part's first element, so every push
is a dense gradient of the full size in the graph (TensorFlow's slice
gradient is dense), as a real model's would be. On the wire it can be
smaller: with parts too big to be packed (10 MB and up), emulated hosts'
links carried 0.12-0.55 of the model's bytes per push (docs/performance.md,
"Parameter-server capacity where the network is the limit"); the pull always
carries all of it.
"""

import tensorflow as tf
import tf_keras

PARTS = 8
BYTES_PER_FLOAT = 4


class ParameterBlob(tf_keras.layers.Layer):
  """`num_floats` weights in PARTS variables; adds their first elements."""

  def __init__(self, num_floats, **kwargs):
    super().__init__(**kwargs)
    self.num_floats = num_floats

  def build(self, input_shape):
    size = max(1, self.num_floats // PARTS)
    self.parts = [self.add_weight(name=f"part_{i}", shape=(size,),
                                  initializer="zeros") for i in range(PARTS)]

  def call(self, logits):
    return logits + tf.add_n([part[0] for part in self.parts])


def blob_model(megabytes, input_shape, num_classes):
  num_floats = int(megabytes * 1e6 / BYTES_PER_FLOAT)
  inputs = tf_keras.Input(input_shape)
  logits = tf_keras.layers.Dense(num_classes)(
      tf_keras.layers.Flatten()(inputs))
  outputs = tf_keras.layers.Softmax()(ParameterBlob(num_floats)(logits))
  return tf_keras.Model(inputs, outputs)
