"""The papers' networks: parameter counts by hand, Caffe layers by hand,
for both Kerases (tf_keras and Keras 3)."""

import keras as keras3
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import models
from models.caffe_layers import layers_for


def conv(k, c_in, c_out, bias=True):
  return k * k * c_in * c_out + (c_out if bias else 0)


def dense(n_in, n_out):
  return n_in * n_out + n_out


@pytest.mark.parametrize("name,input_shape,classes,expected", [
    # cifar10_full: three 5x5 convs and a 1024 -> 10 dense layer.
    ("cifar10_full", (32, 32, 3), 10,
     conv(5, 3, 32) + conv(5, 32, 32) + conv(5, 32, 64) + dense(4 * 4 * 64, 10)),
    # AlexNet without filter groups, 227x227 input: 6x6x256 before fc6.
    ("alexnet", (227, 227, 3), 1000,
     conv(11, 3, 96) + conv(5, 96, 256) + conv(3, 256, 384)
     + conv(3, 384, 384) + conv(3, 384, 256) + dense(6 * 6 * 256, 4096)
     + dense(4096, 4096) + dense(4096, 1000)),
    ("small_cnn", (28, 28, 1), 10,
     conv(3, 1, 32) + conv(3, 32, 64) + dense(5 * 5 * 64, 128)
     + dense(128, 10)),
    # ResNet-20: 19 bias-free 3x3 convs, 19 batch norms (4 values a
    # channel), and the dense layer.
    ("resnet20", (32, 32, 3), 10,
     conv(3, 3, 16, False) + 6 * conv(3, 16, 16, False)
     + conv(3, 16, 32, False) + 5 * conv(3, 32, 32, False)
     + conv(3, 32, 64, False) + 5 * conv(3, 64, 64, False)
     + 4 * (16 * 7 + 32 * 6 + 64 * 6) + dense(64, 10)),
    ("mlp", (28, 28, 1), 10, dense(784, 128) + dense(128, 10)),
])
@pytest.mark.parametrize("keras", models.KERAS_NAMES)
def test_parameter_counts(name, input_shape, classes, expected, keras):
  model = models.build_model(name, input_shape, classes, keras=keras)
  assert model.count_params() == expected
  assert model.output_shape == (None, classes)
  assert isinstance(model, {"tf_keras": tf_keras.Model,
                            "keras3": keras3.Model}[keras])


def test_both_kerases_build_the_same_network():
  # The same layers, names and weight shapes, and the same function of the
  # same weights.
  plain, new = (models.build_model("resnet20", (32, 32, 3), 10, keras=keras)
                for keras in models.KERAS_NAMES)
  assert [w.shape for w in plain.get_weights()] == [
      w.shape for w in new.get_weights()]
  new.set_weights(plain.get_weights())
  x = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
  np.testing.assert_allclose(plain(x, training=False).numpy(),
                             np.asarray(new(x, training=False)), rtol=1e-4,
                             atol=1e-6)


def test_unknown_keras_lists_valid_names():
  with pytest.raises(ValueError, match="'keras2'.*tf_keras, keras3"):
    models.build_model("mlp", (8, 8, 1), 4, keras="keras2")


def test_cifar10_full_is_the_papers_size():
  count = models.build_model("cifar10_full", (32, 32, 3), 10).count_params()
  assert abs(count - 89_600) / 89_600 < 0.01
  assert count == 89_578


def test_unknown_model_lists_valid_names():
  with pytest.raises(ValueError, match="'vgg16'.*alexnet, cifar10_full, mlp, "
                     "resnet20, small_cnn"):
    models.build_model("vgg16", (32, 32, 3), 10)


def test_caffe_multipliers_regularize_as_the_paper():
  model = models.build_model("cifar10_full", (32, 32, 3), 10)
  decays = {layer.name: float(layer.kernel_regularizer.l2)
            for layer in model.layers
            if getattr(layer, "kernel_regularizer", None) is not None}
  # Caffe decay d is the L2 penalty d/2 ||w||^2.
  assert decays == pytest.approx({"conv1": 0.002, "conv2": 0.002,
                                  "conv3": 0.002, "ip1": 0.5})
  plain = models.build_model("cifar10_full", (32, 32, 3), 10,
                             caffe_multipliers=False)
  assert not plain.losses or all(float(l) == 0 for l in plain.losses)


@pytest.mark.parametrize("keras", [tf_keras, keras3])
def test_scaled_bias_doubles_the_gradient(keras):
  layer = layers_for(keras).ScaledBias(lr_mult=2.0)
  x = tf.zeros((3, 4))
  with tf.GradientTape() as tape:
    y = tf.reduce_sum(layer(x))
  # d(sum)/d(bias) is 3 (the batch) per unit; the multiplier makes it 6.
  np.testing.assert_allclose(tape.gradient(y, layer.bias), [6.0] * 4)


@pytest.mark.parametrize("keras", [tf_keras, keras3])
def test_within_channel_lrn_by_hand(keras):
  # All-ones 3x3 image, local size 3, alpha 0.9, beta 0.5: the centre's
  # window holds 9 ones, a corner's 4 (zero padding), an edge's 6:
  # x / (1 + alpha/9 * sum)^beta.
  lrn = layers_for(keras).CaffeLRN(3, alpha=0.9, beta=0.5)
  out = np.asarray(lrn(tf.ones((1, 3, 3, 1))))[0, ..., 0]
  expected = lambda s: (1 + 0.9 / 9 * s) ** -0.5
  assert out[1, 1] == pytest.approx(expected(9))
  assert out[0, 0] == pytest.approx(expected(4))
  assert out[0, 1] == pytest.approx(expected(6))


@pytest.mark.parametrize("keras", [tf_keras, keras3])
def test_across_channel_lrn_matches_caffe_formula(keras):
  # 3 channels of values 1, 2, 3, local size 3: the middle channel sees
  # 1 + 4 + 9 = 14, so 2 / (1 + alpha/3 * 14)^beta.
  caffe_lrn = layers_for(keras).CaffeLRN
  lrn = caffe_lrn(3, alpha=0.3, beta=0.75, region="across_channels")
  out = np.asarray(lrn(tf.constant([[[[1.0, 2.0, 3.0]]]])))[0, 0, 0]
  assert out[1] == pytest.approx(2 / (1 + 0.1 * 14) ** 0.75, rel=1e-5)
  with pytest.raises(ValueError, match="'sideways'"):
    caffe_lrn(region="sideways")
