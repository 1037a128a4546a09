"""Where the data sets come from: names and file locations (no TensorFlow).

Kept apart from `datasets.py` so that flag validation in the launcher can
check a data set before any process imports TensorFlow.
"""

import os

DATASET_NAMES = ("cifar10", "fashion_mnist", "imagenet2012", "synthetic")
FASHION_MNIST_ENV = "RUDRA_FASHION_MNIST_DIR"
FASHION_MNIST_DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte.gz",
    "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz",
    "y_test": "t10k-labels-idx1-ubyte.gz",
}


def fashion_mnist_dir(data_dir=None):
  """--data_dir, else $RUDRA_FASHION_MNIST_DIR, else Debian's location."""
  return (data_dir or os.environ.get(FASHION_MNIST_ENV)
          or FASHION_MNIST_DEFAULT_DIR)
