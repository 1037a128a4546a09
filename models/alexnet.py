"""AlexNet (Krizhevsky et al. 2012), the ImageNet network of the paper.

5 conv + 3 dense layers on 227x227x3 inputs, Caffe's bvlc_alexnet layout
(ReLU, cross-channel LRN after conv1 and conv2, overlapping 3x3/2 max pools,
dropout 0.5 before fc7 and fc8), without the two-GPU filter groups. That is
62,378,344 parameters for 1000 classes; the paper reports about 72M for its
variant.
"""

import tf_keras

from models.caffe_layers import layers_for


def alexnet(input_shape=(227, 227, 3), num_classes=1000, keras=tf_keras):
  layers = keras.layers
  lrn = layers_for(keras).CaffeLRN
  return keras.Sequential([
      layers.Input(input_shape),
      layers.Conv2D(96, 11, strides=4, activation="relu", name="conv1"),
      lrn(5, 1e-4, 0.75, region="across_channels", name="norm1"),
      layers.MaxPool2D(3, 2, name="pool1"),
      layers.Conv2D(256, 5, padding="same", activation="relu", name="conv2"),
      lrn(5, 1e-4, 0.75, region="across_channels", name="norm2"),
      layers.MaxPool2D(3, 2, name="pool2"),
      layers.Conv2D(384, 3, padding="same", activation="relu", name="conv3"),
      layers.Conv2D(384, 3, padding="same", activation="relu", name="conv4"),
      layers.Conv2D(256, 3, padding="same", activation="relu", name="conv5"),
      layers.MaxPool2D(3, 2, name="pool5"),
      layers.Flatten(),
      layers.Dense(4096, activation="relu", name="fc6"),
      layers.Dropout(0.5),
      layers.Dense(4096, activation="relu", name="fc7"),
      layers.Dropout(0.5),
      layers.Dense(num_classes, activation="softmax", name="fc8"),
  ], name="alexnet")
