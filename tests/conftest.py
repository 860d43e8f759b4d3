import os
import pathlib

import onnx
import pytest
from hypothesis import settings

# glibc's mmap threshold, once held (`onnxgrad check`, the explorer: engine/run/allocator.py), stays held
# for the process: in a test worker every later test's blocks over 128 KiB would be system calls (a
# 4-bit BERT's finite differences 3x slower). In tests it is not held; tests of it run in a subprocess.
from engine.run import allocator as _allocator  # noqa: E402

_allocator.hold_mmap_threshold = lambda: False
from explorer import allocator as _explorer_allocator  # noqa: E402

_explorer_allocator.hold_mmap_threshold = _allocator.hold_mmap_threshold

# Fixtures shared by the CLI and explorer tests of models with an unknown op.
pytest_plugins = ("tests.feed_models",)

# CI (.ci/run sets ONNXGRAD_CI) runs every property test on the same examples each time: the gate
# that lands work must not fail on an example nobody has seen. Runs elsewhere draw new examples,
# which is how they find bugs (an x^16 one found the check reporting a quotient 14% off); a new
# failing example becomes an explicit @example.
settings.register_profile("ci", derandomize=True)
if os.environ.get("ONNXGRAD_CI"):
    settings.load_profile("ci")


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
