"""keras-preact: pre-activation ResNets for Keras 3."""

import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
    with open(os.path.join(HERE, "keras_preact", "__init__.py")) as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split("=")[1].strip().strip('"')
    raise RuntimeError("no __version__")


EXPORT_EXTRAS = [
    "tf2onnx==1.17.0",
    "onnx==1.23.2",
    "onnxruntime==1.32.0",
    "ai-edge-litert==2.3.0",
]
# Converters of published PyTorch checkpoints; torch pinned to its CPU build.
TORCH_EXTRAS = ["torch==2.13.0"]
# keras-hub tasks on keras-preact backbones; hf:// and kaggle:// presets.
HUB_EXTRAS = ["keras-hub==0.32.0"]
# The documentation site (mkdocs.yml): `mkdocs build --strict`, API reference from docstrings.
DOCS_EXTRAS = ["mkdocs==1.6.1", "mkdocs-material==9.8.2", "mkdocstrings==1.0.8",
               "mkdocstrings-python==2.0.11"]
# The JAX and PyTorch backend passes; pytest-xdist runs the test files on every core; the
# docs tests build the site; keras-hub's test harness (`keras_hub.src.tests.test_case`)
# imports grain; CI's lint step (.ci/run) and pre-commit run this ruff.
TEST_EXTRAS = (["pytest>=8", "pytest-xdist>=3.5", "jax>=0.4.30", "grain==0.2.18", "ruff==0.8.6"]
               + TORCH_EXTRAS
               + EXPORT_EXTRAS + HUB_EXTRAS + DOCS_EXTRAS)

with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
    LONG_DESCRIPTION = f.read()

setup(
    name="keras-preact",
    version=_version(),
    description="Pre-activation ResNets (Identity Mappings in Deep Residual Networks) for Keras 3",
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["keras_preact", "keras_preact.*"]) + ["keras_preact.zoo"],
    # The catalog (weights manifests, recipes, model cards) lives in zoo/ and ships
    # as the package data of `keras_preact.zoo`.
    package_dir={"keras_preact.zoo": "zoo"},
    # py.typed: type checkers read the package's own annotations (PEP 561).
    package_data={"keras_preact.zoo": ["*.json", "*.md", "*/*.json", "*/*.md"],
                  "keras_preact": ["py.typed"]},
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "keras>=3.15.1",
        "tensorflow-datasets>=4.9.10",
        # tensorflow-datasets imports it to download and prepare, but does not require it.
        "importlib_resources",
        "keras-tuner>=1.4.8",
        "numpy",
        "h5py",
        "scikit-learn",
        "matplotlib",
        "pillow",
        "tensorboard>=2.21,<2.22",
        "filelock>=3.12",
    ],
    extras_require={
        # LiteRT and ONNX export and their parity checks.
        "export": EXPORT_EXTRAS,
        "torch": TORCH_EXTRAS,
        "hub": HUB_EXTRAS,
        "docs": DOCS_EXTRAS,
        "test": TEST_EXTRAS,
        "dev": TEST_EXTRAS + ["build"],
    },
    entry_points={"console_scripts": ["keras-preact=keras_preact.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Framework :: Keras",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
