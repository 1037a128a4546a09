"""ResNet-20 for CIFAR10 (He et al. 2016, section 4.2), a modern reference.

3 stages of 3 basic blocks (16, 32, 64 filters), batch norm, identity
shortcuts with zero-padded channels when the shape changes (option A):
271,098 parameters for 10 classes, batch-norm statistics included (the paper
gives 0.27M).
"""

import functools

import tensorflow as tf
import tf_keras


@functools.lru_cache(maxsize=None)
def shortcut_for(keras):
  """PaddedShortcut subclassing `keras` (tf_keras or Keras 3), registered
  with it as rudra_models>PaddedShortcut."""

  class PaddedShortcut(keras.layers.Layer):
    """Option-A shortcut: subsample by 2 and zero-pad the new channels."""

    def __init__(self, extra_channels, **kwargs):
      super().__init__(**kwargs)
      self.extra_channels = extra_channels

    def call(self, inputs):
      subsampled = inputs[:, ::2, ::2, :]
      half = self.extra_channels // 2
      return tf.pad(subsampled, [[0, 0], [0, 0], [0, 0],
                                 [half, self.extra_channels - half]])

    def get_config(self):
      return {**super().get_config(), "extra_channels": self.extra_channels}

  return keras.saving.register_keras_serializable(package="rudra_models")(
      PaddedShortcut)


PaddedShortcut = shortcut_for(tf_keras)


def resnet20(input_shape=(32, 32, 3), num_classes=10, blocks_per_stage=3,
             keras=tf_keras):
  layers = keras.layers
  regularizer = keras.regularizers.L2(1e-4)
  padded_shortcut = shortcut_for(keras)

  def conv_bn(x, filters, strides=1):
    x = layers.Conv2D(filters, 3, strides=strides, padding="same",
                      use_bias=False, kernel_initializer="he_normal",
                      kernel_regularizer=regularizer)(x)
    return layers.BatchNormalization()(x)

  inputs = layers.Input(input_shape)
  x = layers.ReLU()(conv_bn(inputs, 16))
  for stage, filters in enumerate((16, 32, 64)):
    for block in range(blocks_per_stage):
      strides = 2 if stage > 0 and block == 0 else 1
      shortcut = x
      if strides != 1:
        shortcut = padded_shortcut(filters - x.shape[-1])(x)
      y = layers.ReLU()(conv_bn(x, filters, strides))
      y = conv_bn(y, filters)
      x = layers.ReLU()(layers.Add()([y, shortcut]))
  x = layers.GlobalAveragePooling2D()(x)
  outputs = layers.Dense(num_classes, activation="softmax",
                         kernel_regularizer=regularizer)(x)
  return keras.Model(inputs, outputs, name="resnet20")
