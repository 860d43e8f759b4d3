"""The memory guard (engine/run/memory.py) under a faked machine: ONNXGRAD_MEMORY_AVAILABLE says how
much memory is left, so nothing here allocates more than a few MiB. The bytes a message names are
checked against the value a run without the limit produces (numpy's nbytes)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import engine
from engine.cli import main
from engine.errors import MemoryLimitError
from engine.run import memory
from engine.run.step_errors import step_error

MiB = 1 << 20
WIDTH = 1024  # a [n, WIDTH] float32 value holds n * 4 KiB


@pytest.fixture
def machine(monkeypatch):
    """machine(bytes): from now on the guard believes that much memory is left."""
    def left(nbytes: int) -> None:
        monkeypatch.setenv(memory.ENV, str(nbytes))
        memory.forget_reading()

    yield left
    memory.forget_reading()


def _model(nodes, inputs, outputs, opset=18):
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), opset_imports=[helper.make_opsetid("", opset)])


def _value(name, shape=("n", WIDTH), elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, list(shape))


def chain_proto(length: int) -> onnx.ModelProto:
    """X -> Tanh -> ... -> Tanh: each value dies as soon as the next one exists."""
    nodes = [helper.make_node("Tanh", [f"h{i - 1}" if i else "X"], [f"h{i}"], name=f"t{i}") for i in range(length)]
    return _model(nodes, [_value("X")], [_value(f"h{length - 1}")])


def chain(length: int):
    return engine.load(chain_proto(length)), f"h{length - 1}"


def fan(width: int):
    """X -> `width` Tanh branches -> Sum: every branch stays alive until the Sum reads them all."""
    nodes = [helper.make_node("Tanh", ["X"], [f"b{i}"], name=f"t{i}") for i in range(width)]
    nodes.append(helper.make_node("Sum", [f"b{i}" for i in range(width)], ["Y"], name="sum"))
    return engine.load(_model(nodes, [_value("X")], [_value("Y")]))


def feed(rows: int) -> dict:
    return {"X": np.random.default_rng(0).standard_normal((rows, WIDTH)).astype(np.float32)}


def test_one_step_over_the_limit_names_node_output_shape_and_bytes(machine):
    model, y = chain(3)
    nbytes = model.run(feed(1024))[y].nbytes  # every value of the chain has this size
    machine(int(2.5 * MiB))
    with pytest.raises(MemoryLimitError) as err:
        model.run(feed(1024))
    assert str(err.value) == (f"node 't0' (Tanh): output 'h0' of shape [1024, {WIDTH}] float32 needs 4.0 MiB "
                              f"({nbytes} bytes), more than the 2.5 MiB the machine can still give")


def test_many_steps_each_under_the_limit_fail_together_at_the_step_that_crosses_it(machine):
    model = fan(6)
    x = feed(256)
    want = 6 * np.tanh(x["X"].astype(np.float64))
    machine(8 * MiB)  # six 1 MiB branches and their sum fit
    np.testing.assert_allclose(model.run(x)["Y"], want, rtol=1e-5)
    machine(4 * MiB)  # each branch fits alone; the fifth alive at once does not
    with pytest.raises(MemoryLimitError, match=r"^node 't4' \(Tanh\): output 'b4' of shape \[256, 1024\] float32 "
                                               r"needs 1\.0 MiB \(1048576 bytes\) on top of the 4\.0 MiB the run's "
                                               r"values hold by then, more than the 4\.0 MiB the machine can still give$"):
        model.run(x)


def test_freed_values_leave_the_live_total_so_a_long_chain_passes(machine):
    model, y = chain(40)
    x = feed(256)  # 1 MiB per value, 40 MiB made in all, never more than 2 MiB alive
    machine(int(2.5 * MiB))
    want = x["X"].astype(np.float64)
    for _ in range(40):
        want = np.tanh(want)
    for _ in range(3):  # the interpreter first, then the fx module
        np.testing.assert_allclose(model.run(x)[y], want, rtol=1e-5, atol=1e-6)


def test_the_compiled_module_is_guarded_too(machine):
    model, y = chain(4)
    machine(64 * MiB)
    for _ in range(3):
        model.run(feed(256))
    machine(MiB // 2)
    with pytest.raises(MemoryLimitError, match=r"^node 't0' \(Tanh\): output 'h0' of shape \[256, 1024\]"):
        model.run(feed(256))


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 64), width=st.integers(1, 6), left_kib=st.integers(1, 2048))
def test_a_run_fails_exactly_when_its_peak_of_live_values_exceeds_what_is_left(rows, width, left_kib):
    # Peak: all branches alive plus the sum, each rows * 4 KiB (the oracle counts by hand).
    model = fan(width)
    x = feed(rows)
    value = rows * WIDTH * 4
    peak = (width + 1) * value
    memory.forget_reading()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(memory.ENV, str(left_kib * 1024))
        memory.forget_reading()
        if peak > left_kib * 1024:
            with pytest.raises(MemoryLimitError, match=rf"of shape \[{rows}, {WIDTH}\] float32 needs"):
                model.run(x)
        else:
            np.testing.assert_allclose(model.run(x)["Y"], width * np.tanh(x["X"]), rtol=1e-5)
    memory.forget_reading()


def test_a_weight_cast_where_it_is_read_counts_while_its_step_runs(machine):
    # A float64 run of a float32 model casts a big weight where the MatMul reads it (engine/run/cast_at_use.py):
    # the 2 MiB float64 copy lives while the step runs, beside its 2 KiB output.
    w = np.random.default_rng(1).standard_normal((512, 512)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")], "g", [_value("X", [1, 512])],
                          [_value("Y", [1, 512])], initializer=[onnx.numpy_helper.from_array(w, "W")])
    model = engine.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))
    x = {"X": np.ones((1, 512), np.float32)}
    machine(3 * MiB)
    np.testing.assert_allclose(model.run(x, dtype="float64")["Y"], x["X"].astype(np.float64) @ w, rtol=1e-12)
    machine(MiB)
    assert model.run(x)["Y"].shape == (1, 512)  # float32: the weight is read where it lies
    with pytest.raises(MemoryLimitError, match=r"^node 'mm' \(MatMul\): output 'Y' of shape \[1, 512\] float64 needs "
                                               r"4\.0 KiB \(4096 bytes\) on top of the 2\.0 MiB of weights cast for this "
                                               r"step, more than the 1\.0 MiB the machine can still give$"):
        model.run(x, dtype="float64")


def test_the_gradient_path_is_guarded(machine):
    model, y = chain(3)
    x = feed(256)
    machine(int(2.5 * MiB))
    got = model.gradient(y, ["X"], [], x).grads["X"]
    t = torch.tensor(x["X"], requires_grad=True)
    torch.tanh(torch.tanh(torch.tanh(t))).sum().backward()
    np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-5, atol=1e-6)
    machine(int(1.5 * MiB))
    with pytest.raises(MemoryLimitError, match=r"^node 't1' \(Tanh\): output 'h1' of shape \[256, 1024\] float32 "
                                               r"needs 1\.0 MiB \(1048576 bytes\) on top of the 1\.0 MiB"):
        model.gradient(y, ["X"], [], x)


def test_an_output_sized_by_a_value_is_refused_before_it_is_made(machine):
    model = engine.load(_model([helper.make_node("ConstantOfShape", ["S"], ["Z"], name="fill")],
                               [_value("S", [2], TensorProto.INT64)], [_value("Z", [None, None])]))
    machine(8 * MiB)
    assert model.run({"S": np.array([2, 3])})["Z"].shape == (2, 3)
    for _ in range(2):  # interpreted, then the fx module
        with pytest.raises(MemoryLimitError, match=r"^node 'fill' \(ConstantOfShape\): output 'Z' of shape "
                                                   r"\[2048, 2048\] float32 needs 16\.0 MiB \(16777216 bytes\)"):
            model.run({"S": np.array([2048, 2048])})


_X = _value("X", [2, 2])
SIZED_BY_VALUE = {  # op: (node, inputs, small feeds -> numpy's result, big feeds, the big output's shape)
    "Tile": (helper.make_node("Tile", ["X", "R"], ["Y"], name="n"), [_X, _value("R", [2], TensorProto.INT64)],
             (np.array([2, 3]), lambda x, r: np.tile(x, r)), np.array([1024, 1024]), [2048, 2048]),
    "Pad": (helper.make_node("Pad", ["X", "R"], ["Y"], name="n"), [_X, _value("R", [4], TensorProto.INT64)],
            (np.array([0, 1, 2, 3]), lambda x, r: np.pad(x, [(0, 2), (1, 3)])), np.array([0, 0, 2000, 2000]),
            [2002, 2002]),
    "Range": (helper.make_node("Range", ["A", "R", "D"], ["Y"], name="n"),
              [_value("A", [], TensorProto.INT64), _value("R", [], TensorProto.INT64), _value("D", [], TensorProto.INT64)],
              (np.array(7), lambda a, r: np.arange(0, r, 3)), np.array(4 << 20), [len(range(0, 4 << 20, 3))]),
}


@pytest.mark.parametrize("op", sorted(SIZED_BY_VALUE))
def test_outputs_sized_by_a_value_are_refused_before_they_are_made(machine, op):
    node, inputs, (small, oracle), big, shape = SIZED_BY_VALUE[op]
    model = engine.load(_model([node], inputs, [_value("Y", [None] * len(shape), inputs[0].type.tensor_type.elem_type)]))
    if op == "Range":
        feeds = lambda r: {"A": np.array(0), "R": r, "D": np.array(3)}  # noqa: E731
        x = None
    else:
        x = np.arange(4, dtype=np.float32).reshape(2, 2)
        feeds = lambda r: {"X": x, "R": r}  # noqa: E731
    machine(8 * MiB)
    np.testing.assert_array_equal(model.run(feeds(small))["Y"], oracle(x, small))
    itemsize = 8 if op == "Range" else 4
    nbytes = int(np.prod(shape)) * itemsize
    with pytest.raises(MemoryLimitError, match=rf"^node 'n' \({op}\): output 'Y' of shape \[{', '.join(map(str, shape))}\] "
                                               rf"\w+ needs [0-9.]+ MiB \({nbytes} bytes\)"):
        model.run(feeds(big))


def test_an_add_of_an_expand_to_a_fed_size_is_refused_before_it_is_made(machine):
    # Expand is a view whatever its shape; the Add reading it allocates the whole, of a size no graph says.
    model = engine.load(_model([helper.make_node("Expand", ["X", "S"], ["E"], name="expand"),
                                helper.make_node("Add", ["E", "X"], ["Y"], name="add")],
                               [_value("X", [1, 1]), _value("S", [2], TensorProto.INT64)], [_value("Y", [None, None])]))
    x = np.full((1, 1), 0.5, np.float32)
    machine(8 * MiB)
    np.testing.assert_array_equal(model.run({"X": x, "S": np.array([3, 5])})["Y"], np.ones((3, 5), np.float32))
    for _ in range(2):
        with pytest.raises(MemoryLimitError, match=r"^node 'add' \(Add\): output 'Y' of shape \[2048, 2048\] float32 "
                                                   r"needs 16\.0 MiB \(16777216 bytes\), more than the 8\.0 MiB"):
            model.run({"X": x, "S": np.array([2048, 2048])})


def test_a_failed_allocation_names_node_and_output():
    from types import SimpleNamespace

    step = SimpleNamespace(name="ln2", op_type="LayerNormalization")
    torch_says = RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: "
                              "you tried to allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)")
    err = step_error(step, torch_says, ["Y"])
    assert isinstance(err, MemoryLimitError)
    assert str(err) == "node 'ln2' (LayerNormalization) ran out of memory computing 'Y' (it asked for 1.0 TiB)"
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.1 GiB total)")
    assert str(step_error(step, cuda, ["Y"])) == ("node 'ln2' (LayerNormalization) ran out of memory computing 'Y' "
                                                   "(it asked for 20.00 GiB)")


def test_the_cli_prints_one_line_and_exits_2(machine, tmp_path, capsys):
    path = tmp_path / "chain.onnx"
    onnx.save(chain_proto(3), str(path))
    np.save(tmp_path / "x.npy", feed(1024)["X"])
    machine(MiB)
    assert main(["run", str(path), "--feed", f"X={tmp_path / 'x.npy'}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "node 't0' (Tanh): output 'h0' of shape [1024, 1024] float32 needs 4.0 MiB (4194304 bytes)" in err


@pytest.mark.parametrize("command", [["run"], ["grad", "--y", "logits", "--xs", "X,conv1_W"],
                                     ["check", "--y", "logits", "--xs", "X,conv1_W"]])
def test_run_grad_and_check_refuse_in_one_line(machine, capsys, command):
    from tests import paths

    machine(1024)
    model = str(paths.ROOT / "sample_models" / "small_cnn.onnx")
    assert main([command[0], model, *command[1:]]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    dtype = "float64" if command[0] == "check" else "float32"  # check computes in float64
    assert (f"node 'conv1' (Conv): output 'c1' of shape [2, 4, 8, 8] {dtype} needs "
            f"{2 if dtype == 'float32' else 4}.0 KiB") in err


def test_what_is_left_is_the_lowest_of_the_kernel_and_the_cgroup(monkeypatch, tmp_path):
    monkeypatch.delenv(memory.ENV, raising=False)
    (tmp_path / "memory.max").write_text("1000000\n")
    (tmp_path / "memory.current").write_text("400000\n")
    (tmp_path / "memory.stat").write_text("anon 300000\ninactive_file 50000\nactive_file 1\n")
    monkeypatch.setattr(memory, "_cgroup_folders",
                        lambda: [(str(tmp_path), "memory.max", "memory.current", b"inactive_file")])
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 10**9)
    assert memory.available_bytes() == 1000000 - 400000 + 50000  # inactive page cache is given back first
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 1234)
    assert memory.available_bytes() == 1234
    (tmp_path / "memory.max").write_text("max\n")
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 10**9)
    assert memory.available_bytes() == 10**9


def test_under_ulimit_v_what_is_left_is_the_address_space_left(monkeypatch):
    import resource

    with open("/proc/self/status") as f:
        mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    monkeypatch.setattr(resource, "getrlimit", lambda which: (mapped + 64 * MiB, resource.RLIM_INFINITY))
    assert 32 * MiB < memory._address_space_room() <= 64 * MiB
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert memory._address_space_room() is None


def test_the_machine_is_read_once_while_runs_need_little(monkeypatch):
    reads = []
    monkeypatch.setattr(memory, "available_bytes", lambda: reads.append(1) or 20 * MiB)
    monkeypatch.setattr(memory, "FRESH_S", 3600.0)  # a loaded machine's first runs may take seconds
    memory.forget_reading()
    model, y = chain(3)
    for _ in range(20):
        model.run(feed(4))  # 16 KiB values
    assert len(reads) == 1
    model.run(feed(1600))  # 12.5 MiB alive at once: more than half the last reading, so it reads again
    assert len(reads) == 2
    monkeypatch.setattr(memory, "FRESH_S", 0.0)  # an old reading is read again, however little a run needs
    model.run(feed(4))
    assert len(reads) == 3
    memory.forget_reading()


@pytest.mark.parametrize("text,nbytes", [("1000", 1000), ("512MiB", 512 * MiB), ("1.5 GiB", 3 * 512 * MiB)])
def test_sizes_are_read_with_their_units(text, nbytes):
    assert memory.parse_size(text) == nbytes
