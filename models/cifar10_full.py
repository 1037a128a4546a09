"""Caffe's cifar10_full, the CIFAR10 network of Gupta et al. (ICDM 2016).

conv 5x5x32 pad 2 (std 1e-4) -> maxpool 3x3/2 -> ReLU -> LRN(3, 5e-5, 0.75)
-> conv 5x5x32 pad 2 (std 0.01) + ReLU -> avgpool 3x3/2 -> LRN
-> conv 5x5x64 pad 2 (std 0.01) + ReLU -> avgpool 3x3/2
-> dense 1024 -> 10 (std 0.01), softmax.  89,578 parameters.

Caffe's pooling rounds output sizes up (32 -> 16 -> 8 -> 4): "same" padding.
With `caffe_multipliers=True` (the paper's solver): biases learn at 2x the
rate, and weight decay is 0.004 on the conv layers and 1.0 on the dense
layer. Caffe's decay d adds d·w to the gradient, which is the gradient of
the L2 penalty (d/2)·||w||².
"""

import tf_keras

from models.caffe_layers import layers_for

CONV_WEIGHT_DECAY = 0.004
DENSE_WEIGHT_DECAY = 1.0
BIAS_LR_MULT = 2.0


def cifar10_full(input_shape=(32, 32, 3), num_classes=10,
                 caffe_multipliers=True, keras=tf_keras):
  layers = keras.layers
  normal = keras.initializers.RandomNormal
  caffe = layers_for(keras)

  def regularizer(decay):
    return keras.regularizers.L2(decay / 2) if caffe_multipliers else None

  def conv(filters, std, name):
    return [layers.Conv2D(filters, 5, padding="same", use_bias=False,
                          kernel_initializer=normal(stddev=std),
                          kernel_regularizer=regularizer(CONV_WEIGHT_DECAY),
                          name=name),
            caffe.ScaledBias(BIAS_LR_MULT if caffe_multipliers else 1.0,
                       name=f"{name}_bias")]

  return keras.Sequential([
      layers.Input(input_shape),
      *conv(32, 1e-4, "conv1"),
      layers.MaxPool2D(3, 2, padding="same", name="pool1"),
      layers.ReLU(name="relu1"),
      caffe.CaffeLRN(3, 5e-5, 0.75, name="norm1"),
      *conv(32, 0.01, "conv2"),
      layers.ReLU(name="relu2"),
      layers.AveragePooling2D(3, 2, padding="same", name="pool2"),
      caffe.CaffeLRN(3, 5e-5, 0.75, name="norm2"),
      *conv(64, 0.01, "conv3"),
      layers.ReLU(name="relu3"),
      layers.AveragePooling2D(3, 2, padding="same", name="pool3"),
      layers.Flatten(name="flatten"),
      layers.Dense(num_classes, use_bias=False,
                   kernel_initializer=normal(stddev=0.01),
                   kernel_regularizer=regularizer(DENSE_WEIGHT_DECAY),
                   name="ip1"),
      caffe.ScaledBias(BIAS_LR_MULT if caffe_multipliers else 1.0, name="ip1_bias"),
      layers.Softmax(name="prob"),
  ], name="cifar10_full")
