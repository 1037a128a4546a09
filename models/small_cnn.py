"""Small networks for 28x28 grayscale data (Fashion-MNIST, MNIST) and tests."""

import tf_keras


def small_cnn(input_shape=(28, 28, 1), num_classes=10, dropout=0.2,
              keras=tf_keras):
  """Two 3x3 conv blocks and a 128-unit dense layer: 225,034 parameters.

  Dropout before each dense layer: without it the network overfits
  Fashion-MNIST (92% training, 89% test accuracy after 5 epochs).
  """
  layers = keras.layers
  return keras.Sequential([
      layers.Input(input_shape),
      layers.Conv2D(32, 3, activation="relu", name="conv1"),
      layers.MaxPool2D(2, name="pool1"),
      layers.Conv2D(64, 3, activation="relu", name="conv2"),
      layers.MaxPool2D(2, name="pool2"),
      layers.Flatten(),
      layers.Dropout(dropout),
      layers.Dense(128, activation="relu", name="fc1"),
      layers.Dropout(dropout),
      layers.Dense(num_classes, activation="softmax", name="fc2"),
  ], name="small_cnn")


def mlp(input_shape=(28, 28, 1), num_classes=10, hidden=128, keras=tf_keras):
  """One hidden layer: a tiny model for smoke tests and benchmarks."""
  layers = keras.layers
  return keras.Sequential([
      layers.Input(input_shape),
      layers.Flatten(),
      layers.Dense(hidden, activation="relu", name="fc1"),
      layers.Dense(num_classes, activation="softmax", name="fc2"),
  ], name="mlp")
