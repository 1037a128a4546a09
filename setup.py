"""rudra_tf: Rudra's staleness-controlled parameter-server training for TensorFlow."""

import setuptools

setuptools.setup(
    name="rudra_tf",
    version="0.1.0",
    description=("Parameter-server training with controlled staleness "
                 "(Rudra: hardsync, n-softsync, async) for TensorFlow"),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=["rudra_tf", "models", "launch"],
    python_requires=">=3.10",
    # The strategy leans on a few private TensorFlow, tf_keras and Keras 3
    # hooks (tested in tests/test_tf_hooks.py): keep them pinned to the
    # tested releases.
    install_requires=[
        "tensorflow==2.21.*",
        "tf-keras==2.21.*",
        "keras==3.15.*",
        "tensorboard==2.21.*",
        "numpy",
        "absl-py",
        "portpicker",
        "matplotlib",
    ],
    extras_require={
        "datasets": ["tensorflow-datasets"],
        # Learners on NVIDIA GPUs (--gpus): TensorFlow's CUDA 12 libraries
        # as pip packages (about 3 GB).
        "gpu": ["tensorflow[and-cuda]==2.21.*"],
        # benchmarks/soak.py samples every task's memory.
        "benchmarks": ["psutil"],
        "test": ["pytest", "psutil", "tensorflow-datasets"],
    },
    entry_points={
        "console_scripts": ["rudra-train = launch.train:run"],
    },
)
