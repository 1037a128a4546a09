"""Input pipelines: real Fashion-MNIST files, tfds mock data, learner shards."""

import gzip
import os
import struct

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow.python.distribute import distribute_lib

from rudra_tf import datasets


def write_idx(path, array):
  header = bytes([0, 0, 8, array.ndim]) + struct.pack(
      f">{array.ndim}I", *array.shape)
  with gzip.open(path, "wb") as stream:
    stream.write(header + array.astype(np.uint8).tobytes())


def context(learner, learners):
  return distribute_lib.InputContext(num_input_pipelines=learners,
                                     input_pipeline_id=learner)


def test_read_idx_round_trip_and_errors(tmp_path):
  array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
  write_idx(str(tmp_path / "a.gz"), array)
  np.testing.assert_array_equal(datasets.read_idx(str(tmp_path / "a.gz")),
                                array)
  (tmp_path / "bad").write_bytes(b"\x00\x00\x09\x01\x00\x00\x00\x01\x05")
  with pytest.raises(ValueError, match="not an unsigned-byte IDX"):
    datasets.read_idx(str(tmp_path / "bad"))
  (tmp_path / "short").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x09\x05")
  with pytest.raises(ValueError, match="truncated"):
    datasets.read_idx(str(tmp_path / "short"))


def test_real_fashion_mnist_files():
  data = datasets.load_fashion_mnist()
  assert data.x_train.shape == (60000, 28, 28, 1)
  assert data.x_test.shape == (10000, 28, 28, 1)
  assert data.x_train.dtype == np.uint8 and data.y_train.dtype == np.int64
  assert np.bincount(data.y_train).tolist() == [6000] * 10
  assert np.bincount(data.y_test).tolist() == [1000] * 10
  assert data.x_train.max() == 255 and data.x_train.min() == 0


def test_missing_fashion_mnist_names_the_package(tmp_path):
  with pytest.raises(FileNotFoundError,
                     match="apt-get install dataset-fashion-mnist"):
    datasets.load_fashion_mnist(str(tmp_path))


def test_fashion_mnist_dir_from_environment(tmp_path, monkeypatch):
  rng = np.random.default_rng(0)
  for key, name in datasets.FASHION_MNIST_FILES.items():
    size = 12 if "train" in key else 5
    array = (rng.integers(0, 256, (size, 28, 28)) if key.startswith("x")
             else np.arange(size) % 10)
    write_idx(str(tmp_path / name), array)
  monkeypatch.setenv(datasets.FASHION_MNIST_ENV, str(tmp_path))
  data = datasets.load_fashion_mnist()
  assert data.train_size == 12 and data.test_size == 5


def test_learner_shards_are_disjoint_and_cover_the_training_split():
  data = datasets.load_synthetic(train_size=101, test_size=10)
  rows = lambda x: {tuple(r) for r in np.round(x.reshape(len(x), -1), 3)}
  everything = rows(data.preprocess(data.x_train).numpy())
  assert len(everything) == 101  # every image is distinct
  shards = []
  for learner in range(3):
    batches = data.learner_dataset(context(learner, 3), batch_size=8,
                                   repeat=False)
    images = np.concatenate([x.numpy() for x, _ in batches])
    shards.append(rows(images))
  assert sum(len(s) for s in shards) == 101
  assert set.union(*shards) == everything
  for a in range(3):
    for b in range(a + 1, 3):
      assert not shards[a] & shards[b]


def test_learner_dataset_batches_mu_examples_and_subtracts_the_mean():
  data = datasets.load_synthetic(train_size=64, test_size=8)
  x, y = next(iter(data.learner_dataset(context(1, 2), batch_size=5)))
  assert x.shape == (5, 28, 28, 1) and x.dtype == tf.float32
  assert y.dtype == tf.int64
  centred = data.preprocess(data.x_train).numpy()
  np.testing.assert_allclose(centred.mean(axis=0), 0.0, atol=1e-5)
  np.testing.assert_allclose(data.preprocess(data.mean_image[None]), 0.0,
                             atol=1e-6)


def test_cifar10_through_tensorflow_datasets_mock_data():
  with tfds.testing.mock_data(num_examples=20):
    data = datasets.load_dataset("cifar10", download=False)
  assert data.x_train.shape == (20, 32, 32, 3)
  assert data.x_train.dtype == np.uint8 and data.num_classes == 10
  assert data.y_train.min() >= 0 and data.y_train.max() < 10
  x, _ = next(iter(data.learner_dataset(context(0, 2), batch_size=4)))
  assert x.shape == (4, 32, 32, 3)


def test_imagenet_through_tensorflow_datasets_mock_data(tmp_path):
  with tfds.testing.mock_data(num_examples=10):
    data = datasets.load_imagenet2012(manual_dir=str(tmp_path),
                                      mean_samples=6)
    x, y = next(iter(data.learner_dataset(context(1, 2), batch_size=3)))
    test_x, _ = next(iter(data.test_dataset(2)))
  assert data.mean_image.shape == (256, 256, 3)
  assert x.shape == (3, 227, 227, 3) and y.dtype == tf.int64
  assert test_x.shape == (2, 227, 227, 3)
  assert data.num_classes == 1000


def test_unknown_dataset_lists_valid_names():
  with pytest.raises(ValueError, match="'mnist'.*cifar10, fashion_mnist, "
                     "imagenet2012, synthetic"):
    datasets.load_dataset("mnist")
