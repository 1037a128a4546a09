"""Input pipelines: per-pixel mean subtraction and one shard per learner.

Data sets, by name (`load_dataset`):

* "fashion_mnist": the IDX files of Debian's `dataset-fashion-mnist` package
  in /usr/share/datasets/fashion-mnist/ (or $RUDRA_FASHION_MNIST_DIR, or
  `data_dir`).
* "cifar10": tensorflow-datasets (downloads where the network allows).
* "imagenet2012": tensorflow-datasets with the archives in `manual_dir`.
* "synthetic": random images whose labels a small network can learn.

Every learner reads its own shard of the training split: a dataset function
receives `InputContext(num_input_pipelines=λ, input_pipeline_id=i)` from
`RudraStrategy` and `learner_dataset` shards by it, μ examples per batch.
Images are given as float32 (x - per-pixel training mean) / 255, as in the
paper's per-pixel mean subtraction (scaled for learning rates near 0.01).
"""

import dataclasses
import gzip
import os
import struct

import numpy as np
import tensorflow as tf

from rudra_tf import tf_hooks
from rudra_tf.dataset_sources import DATASET_NAMES  # pylint: disable=unused-import
from rudra_tf.dataset_sources import FASHION_MNIST_ENV
from rudra_tf.dataset_sources import FASHION_MNIST_FILES
from rudra_tf.dataset_sources import fashion_mnist_dir

PIXEL_SCALE = 1.0 / 255.0
# ImageNet: Caffe resizes to 256x256 and crops 227x227; the per-pixel mean is
# estimated from this many training images (a full pass is hours).
IMAGENET_RESIZE = 256
IMAGENET_CROP = 227
IMAGENET_MEAN_SAMPLES = 10000


def with_step_time(dataset, seconds):
  """Each batch of `dataset` is handed out `seconds` late: emulated compute.

  For studies and benchmarks on a machine with fewer cores than learners:
  a sleeping learner uses no CPU, so λ learners with the same step time
  really run at equal speeds (and one with a longer time is a straggler).
  The sleep comes after `prefetch`, so it is paid inside the learner's step,
  between its pull and its push, instead of overlapping the step.
  (TensorFlow's SleepDataset op; its Python wrapper is private.)
  """
  if seconds < 0:
    raise ValueError(f"step time must be >= 0 seconds, got {seconds}.")
  if seconds == 0:
    return dataset
  return dataset.apply(tf_hooks.sleep_transformation(
      int(round(seconds * 1e6))))


@dataclasses.dataclass
class InMemoryImages:
  """A data set held as uint8 numpy arrays (N, H, W, C) and int64 labels."""
  name: str
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int

  def __post_init__(self):
    self.mean_image = self.x_train.mean(axis=0, dtype=np.float64).astype(
        np.float32)

  @property
  def input_shape(self):
    return tuple(self.x_train.shape[1:])

  @property
  def train_size(self):
    return len(self.x_train)

  @property
  def test_size(self):
    return len(self.x_test)

  def preprocess(self, images):
    """uint8 images -> float32 (x - mean) / 255 (numpy or tensors)."""
    return (tf.cast(images, tf.float32) - self.mean_image) * PIXEL_SCALE

  def learner_dataset(self, input_context, batch_size, seed=0, shuffle=True,
                      repeat=True):
    """Learner `input_context.input_pipeline_id`'s shard, μ = batch_size."""
    learner = input_context.input_pipeline_id if input_context else 0
    learners = input_context.num_input_pipelines if input_context else 1
    dataset = tf.data.Dataset.from_tensor_slices(
        (self.x_train, self.y_train)).shard(learners, learner)
    if shuffle:
      dataset = dataset.shuffle(
          min(self.train_size // learners + 1, 60000), seed=seed + learner,
          reshuffle_each_iteration=True)
    if repeat:
      dataset = dataset.repeat()
    return (dataset.batch(batch_size, drop_remainder=repeat)
            .map(lambda x, y: (self.preprocess(x), y),
                 num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))

  def learner_batches(self, learner, num_learners, batch_size, seed=0):
    """Endless numpy batches of a learner's shard (for the simulator).

    The same shard as `learner_dataset` (every λ-th example from `learner`),
    reshuffled each pass with a generator seeded by seed + learner.
    """
    indices = np.arange(learner, self.train_size, num_learners)
    rng = np.random.default_rng(seed + learner)
    while True:
      order = rng.permutation(indices)
      for start in range(0, len(order) - batch_size + 1, batch_size):
        chosen = order[start:start + batch_size]
        x = (self.x_train[chosen].astype(np.float32) - self.mean_image) * (
            PIXEL_SCALE)
        yield x, self.y_train[chosen]

  def test_dataset(self, batch_size):
    """The test split, in order, preprocessed (finite)."""
    return (tf.data.Dataset.from_tensor_slices((self.x_test, self.y_test))
            .batch(batch_size)
            .map(lambda x, y: (self.preprocess(x), y)))


# ---------------------------------------------------------------- IDX files
def read_idx(path):
  """Reads an IDX file (optionally gzipped) into a numpy array."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as stream:
    data = stream.read()
  if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
    raise ValueError(f"{path} is not an unsigned-byte IDX file.")
  rank = data[3]
  shape = struct.unpack(f">{rank}I", data[4:4 + 4 * rank])
  array = np.frombuffer(data, np.uint8, offset=4 + 4 * rank)
  if array.size != int(np.prod(shape)):
    raise ValueError(f"{path}: header says {shape} but holds {array.size} "
                     "values (truncated file?).")
  return array.reshape(shape)


def load_fashion_mnist(data_dir=None):
  directory = fashion_mnist_dir(data_dir)
  arrays = {}
  for key, filename in FASHION_MNIST_FILES.items():
    path = os.path.join(directory, filename)
    if not os.path.exists(path):
      raise FileNotFoundError(
          f"Fashion-MNIST file {path} not found. Install Debian's package "
          "(apt-get install dataset-fashion-mnist), or point --data_dir or "
          f"${FASHION_MNIST_ENV} at a folder holding "
          f"{', '.join(FASHION_MNIST_FILES.values())}.")
    arrays[key] = read_idx(path)
  return InMemoryImages(
      "fashion_mnist", arrays["x_train"][..., None],
      arrays["y_train"].astype(np.int64), arrays["x_test"][..., None],
      arrays["y_test"].astype(np.int64), num_classes=10)


# -------------------------------------------------------------- synthetic
def load_synthetic(train_size=2048, test_size=512, image_shape=(28, 28, 1),
                   num_classes=10, seed=0):
  """Random uint8 images labelled by a fixed random linear map (learnable)."""
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, size=(train_size + test_size, *image_shape),
                        dtype=np.uint8)
  projection = rng.normal(size=(int(np.prod(image_shape)), num_classes))
  centered = images.reshape(len(images), -1).astype(np.float32) - 127.5
  labels = (centered @ projection).argmax(1).astype(np.int64)
  return InMemoryImages("synthetic", images[:train_size], labels[:train_size],
                        images[train_size:], labels[train_size:],
                        num_classes=num_classes)


# ------------------------------------------------------ tensorflow-datasets
def _split_to_numpy(dataset):
  """(image, label) dataset -> uint8 images, int64 labels (read in batches)."""
  images, labels = [], []
  for image_batch, label_batch in dataset.batch(10000).as_numpy_iterator():
    images.append(image_batch)
    labels.append(label_batch)
  return (np.concatenate(images).astype(np.uint8),
          np.concatenate(labels).astype(np.int64))


def load_cifar10(data_dir=None, download=True):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  train, test = tfds.load("cifar10", split=["train", "test"],
                          as_supervised=True, data_dir=data_dir,
                          download=download)
  return InMemoryImages("cifar10", *_split_to_numpy(train),
                        *_split_to_numpy(test), num_classes=10)


@dataclasses.dataclass
class StreamedImageNet:
  """ILSVRC 2012 through tensorflow-datasets, streamed (never in memory)."""
  builder: object
  mean_image: np.ndarray
  name: str = "imagenet2012"
  num_classes: int = 1000
  input_shape: tuple = (IMAGENET_CROP, IMAGENET_CROP, 3)

  @property
  def train_size(self):
    return self.builder.info.splits["train"].num_examples

  @property
  def test_size(self):
    return self.builder.info.splits["validation"].num_examples

  def _decode(self, example, train):
    image = tf.image.resize(example["image"], [IMAGENET_RESIZE] * 2)
    image = (image - self.mean_image) * PIXEL_SCALE
    if train:
      image = tf.image.random_crop(image, self.input_shape)
      image = tf.image.random_flip_left_right(image)
    else:
      offset = (IMAGENET_RESIZE - IMAGENET_CROP) // 2
      image = image[offset:offset + IMAGENET_CROP,
                    offset:offset + IMAGENET_CROP]
    return image, example["label"]

  def learner_dataset(self, input_context, batch_size, seed=0, shuffle=True,
                      repeat=True):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    learner = input_context.input_pipeline_id if input_context else 0
    learners = input_context.num_input_pipelines if input_context else 1
    split = tfds.even_splits("train", n=learners)[learner]
    dataset = self.builder.as_dataset(split=split, shuffle_files=shuffle)
    if shuffle:
      dataset = dataset.shuffle(10000, seed=seed + learner)
    if repeat:
      dataset = dataset.repeat()
    return (dataset.map(lambda e: self._decode(e, True),
                        num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch_size, drop_remainder=repeat)
            .prefetch(tf.data.AUTOTUNE))

  def test_dataset(self, batch_size):
    return (self.builder.as_dataset(split="validation")
            .map(lambda e: self._decode(e, False),
                 num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch_size).prefetch(tf.data.AUTOTUNE))


def load_imagenet2012(data_dir=None, manual_dir=None,
                      mean_samples=IMAGENET_MEAN_SAMPLES):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder("imagenet2012", data_dir=data_dir)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  images = builder.as_dataset(split="train").take(mean_samples).map(
      lambda e: tf.image.resize(e["image"], [IMAGENET_RESIZE] * 2))
  total, count = np.zeros((IMAGENET_RESIZE, IMAGENET_RESIZE, 3)), 0
  for image in images.batch(256).as_numpy_iterator():
    total += image.sum(axis=0)
    count += len(image)
  return StreamedImageNet(builder, (total / max(count, 1)).astype(np.float32))


def load_dataset(name, data_dir=None, manual_dir=None, download=True):
  """Loads a data set by name; lists the valid names for an unknown one."""
  if name == "fashion_mnist":
    return load_fashion_mnist(data_dir)
  if name == "synthetic":
    return load_synthetic()
  if name == "cifar10":
    return load_cifar10(data_dir, download=download)
  if name == "imagenet2012":
    return load_imagenet2012(data_dir, manual_dir)
  raise ValueError(f"Unknown dataset {name!r}; valid datasets are "
                   f"{', '.join(DATASET_NAMES)}.")
