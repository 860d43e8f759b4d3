"""Every model ONNX ships under backend/test/data/{simple,pytorch-converted,pytorch-operator}
runs through the engine and reproduces its shipped outputs."""
import glob
import os

import onnx
import pytest
from onnx import numpy_helper

import engine
from engine.conformance import compare

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
FOLDERS = sorted(glob.glob(os.path.join(DATA, "simple", "*", ""))
                 + glob.glob(os.path.join(DATA, "pytorch-converted", "*", ""))
                 + glob.glob(os.path.join(DATA, "pytorch-operator", "*", "")))


def _numbered(folder, stem):
    paths = glob.glob(os.path.join(folder, f"{stem}_*.pb"))
    return sorted(paths, key=lambda p: int(p.rsplit("_", 1)[1][:-3]))


def _tensor(path):
    return numpy_helper.to_array(onnx.load_tensor(path))


def test_the_shipped_suites_are_all_there():
    assert len(FOLDERS) >= 140


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: "/".join(f.rstrip(os.sep).split(os.sep)[-2:]))
def test_shipped_model_reproduces_shipped_outputs(folder):
    model = engine.load(os.path.join(folder, "model.onnx"))
    data_sets = sorted(glob.glob(os.path.join(folder, "test_data_set_*")))
    assert data_sets
    for ds in data_sets:
        feeds = dict(zip(model.inputs, map(_tensor, _numbered(ds, "input"))))
        got = model.run(feeds)
        expected = list(map(_tensor, _numbered(ds, "output")))
        assert expected
        for name, want in zip(model.outputs, expected):
            problem = compare(got[name], want, rtol=1e-3, atol=1e-5)
            assert not problem, f"{name}: {problem}"
