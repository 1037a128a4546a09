"""Caffe building blocks the papers' networks use: LRN and 2x bias rates.

`layers_for(keras)` makes them for tf_keras or Keras 3 (each Keras has its
own Layer class and registry); the module's `ScaledBias` and `CaffeLRN` are
tf_keras's.
"""

import functools
import types

import tensorflow as tf
import tf_keras


@tf.custom_gradient
def _scale_gradient(x, scale):
  def grad(upstream):
    return upstream * scale, None
  return tf.identity(x), grad


@functools.lru_cache(maxsize=None)
def layers_for(keras):
  """ScaledBias and CaffeLRN subclassing `keras` (the tf_keras or Keras 3
  module), registered with it as rudra_models>ScaledBias, >CaffeLRN."""
  register = keras.saving.register_keras_serializable(package="rudra_models")

  class ScaledBias(keras.layers.Layer):
    """Adds a bias whose gradient is multiplied by `lr_mult`.

    Caffe's `lr_mult: 2` for biases: with SGD (and momentum), a gradient scaled
    by k is exactly a learning rate scaled by k.
    """

    def __init__(self, lr_mult=2.0, **kwargs):
      super().__init__(**kwargs)
      self.lr_mult = float(lr_mult)

    def build(self, input_shape):
      self.bias = self.add_weight(name="bias", shape=(input_shape[-1],),
                                  initializer="zeros")
      super().build(input_shape)

    def call(self, inputs):
      # Read first: a Keras 3 Variable would be read inside the custom
      # gradient, which then demands a gradient for it too.
      bias = _scale_gradient(tf.convert_to_tensor(self.bias),
                             tf.constant(self.lr_mult, self.dtype))
      return inputs + bias

    def get_config(self):
      return {**super().get_config(), "lr_mult": self.lr_mult}


  class CaffeLRN(keras.layers.Layer):
    """Caffe's local response normalization.

    WITHIN_CHANNEL (cifar10_full): x / (1 + α/n² · Σ_{n×n window} x²)^β,
    the window sum taken with zero padding, as an n×n average pool.
    ACROSS_CHANNELS (AlexNet): x / (1 + α/n · Σ_{n channels} x²)^β.
    """

    def __init__(self, local_size=3, alpha=5e-5, beta=0.75,
                 region="within_channel", **kwargs):
      super().__init__(**kwargs)
      if region not in ("within_channel", "across_channels"):
        raise ValueError(f"Unknown LRN region {region!r}; valid values are "
                         "'within_channel', 'across_channels'.")
      self.local_size, self.alpha, self.beta = local_size, alpha, beta
      self.region = region

    def call(self, inputs):
      if self.region == "across_channels":
        return tf.nn.local_response_normalization(
            inputs, depth_radius=self.local_size // 2, bias=1.0,
            alpha=self.alpha / self.local_size, beta=self.beta)
      # Zero-pad, then average over the full n×n window: Caffe divides by n²
      # whether or not the window hangs over the border.
      half = self.local_size // 2
      padded = tf.pad(tf.square(inputs), [[0, 0], [half, half], [half, half],
                                          [0, 0]])
      window_sum = tf.nn.avg_pool2d(padded, self.local_size, 1, "VALID") * (
          self.local_size ** 2)
      scale = 1.0 + self.alpha / self.local_size ** 2 * window_sum
      return inputs * tf.pow(scale, -self.beta)

    def get_config(self):
      return {**super().get_config(), "local_size": self.local_size,
              "alpha": self.alpha, "beta": self.beta, "region": self.region}

  return types.SimpleNamespace(ScaledBias=register(ScaledBias),
                               CaffeLRN=register(CaffeLRN))


ScaledBias = layers_for(tf_keras).ScaledBias
CaffeLRN = layers_for(tf_keras).CaffeLRN
