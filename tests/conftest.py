import os
import pathlib

import onnx
import pytest

# Fixtures shared by the CLI and explorer tests of models with an unknown op.
pytest_plugins = ("tests.feed_models",)


@pytest.fixture(scope="session")
def onnx_data() -> pathlib.Path:
    """The onnx package's shipped backend test data."""
    return pathlib.Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data"


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
