"""A seeded fuzz of the load path: mutate the sample models, then load, run and differentiate them.

Byte-level mutations (bit flips, overwritten bytes, truncation, insertion) and proto-level ones
(attribute values, dims, element types, op types, opsets, wiring, removed nodes) of every model in
sample_models/. Each case must either work or fail with an OnnxGradError whose message is one line;
anything else is an escape. Prints one JSON line: {"cases", "loaded", "refused", "escapes"}.

    python tests/load_fuzz.py [--bytes 10000] [--protos 2300] [--seed 0] [--memory-gb 4]

`--memory-gb` caps this process's address space, so a mutated shape that asks for more fails here
(as an out-of-memory error, which must be one line too) instead of exhausting the machine.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import resource
import sys
import warnings

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ("Relu", "Add", "MatMul", "Gemm", "Conv", "Reshape", "Softmax", "Transpose", "Concat", "Gather",
       "LayerNormalization", "ReduceSum", "Sigmoid", "Identity", "Expand", "Slice", "Unknown")
INTS = (0, 1, -1, 2, 3, 7, 64, -2**31, 2**31 - 1, 2**40, -2**40)
FLOATS = (0.0, -1.0, 1e30, -1e-30, float("nan"), float("inf"))
MAX_FEED = 1 << 16  # elements per fed input; bigger declared inputs are left unfed


def byte_mutation(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    kind = rng.random()
    if kind < 0.1:
        return bytes(b[:rng.randrange(len(b))])
    if kind < 0.15:
        at = rng.randrange(len(b) + 1)
        return bytes(b[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) + b[at:])
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(b))
        b[at] = b[at] ^ (1 << rng.randrange(8)) if rng.random() < 0.7 else rng.randrange(256)
    return bytes(b)


def proto_mutation(model: onnx.ModelProto, rng: random.Random) -> bytes:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    kind = rng.choice(["attribute", "dims", "dtype", "op", "opset", "wiring", "remove", "string"])
    nodes = list(g.node)
    if kind == "attribute" and any(n.attribute for n in nodes):
        a = rng.choice([a for n in nodes for a in n.attribute])
        if a.type == AttributeProto.INT:
            a.i = rng.choice(INTS)
        elif a.type == AttributeProto.INTS and len(a.ints):
            a.ints[rng.randrange(len(a.ints))] = rng.choice(INTS)
        elif a.type == AttributeProto.FLOAT:
            a.f = rng.choice(FLOATS)
        elif a.type in (AttributeProto.STRING, AttributeProto.STRINGS):
            value = bytes(rng.randrange(256) for _ in range(rng.randint(0, 4)))
            if a.type == AttributeProto.STRING:
                a.s = value
            elif len(a.strings):
                a.strings[rng.randrange(len(a.strings))] = value
        else:
            a.type = rng.randrange(15)
    elif kind == "dims":
        holders = [vi.type.tensor_type.shape for vi in list(g.input) + list(g.output) if vi.type.tensor_type.shape.dim]
        tensors = [t for t in g.initializer if len(t.dims)]
        if tensors and (not holders or rng.random() < 0.5):
            t = rng.choice(tensors)
            t.dims[rng.randrange(len(t.dims))] = rng.choice(INTS)
        elif holders:
            dim = rng.choice(holders).dim
            dim[rng.randrange(len(dim))].dim_value = abs(rng.choice(INTS)) % (1 << 62)
    elif kind == "dtype":
        if g.initializer and rng.random() < 0.5:
            rng.choice(g.initializer).data_type = rng.randrange(26)
        else:
            rng.choice(list(g.input) + list(g.output)).type.tensor_type.elem_type = rng.randrange(26)
    elif kind == "op" and nodes:
        rng.choice(nodes).op_type = rng.choice(OPS)
    elif kind == "opset":
        m.opset_import[0].version = rng.randint(1, 26)
    elif kind == "wiring" and nodes:
        names = [t for n in nodes for t in list(n.input) + list(n.output)] + ["nowhere", ""]
        n = rng.choice(nodes)
        field = n.input if (n.input and rng.random() < 0.6) else n.output
        if len(field):
            field[rng.randrange(len(field))] = rng.choice(names)
    elif kind == "remove" and nodes:
        g.node.remove(rng.choice(nodes))
    else:  # a name that is not UTF-8, somewhere protobuf keeps it as a string
        target = rng.choice(nodes) if nodes else None
        if target is not None:
            raw = target.SerializeToString().replace(target.output[0].encode(), b"\xff" * len(target.output[0]), 1) \
                if target.output and target.output[0] else target.SerializeToString()
            target.ParseFromString(raw)
    return m.SerializeToString()


def feeds_for(model) -> dict[str, np.ndarray] | None:
    rng = np.random.default_rng(0)
    feeds = {}
    for name in model.inputs:
        info = model.graph.types.get(name)
        if info is None or info.elem_type is None or info.shape is None:
            return None
        shape = tuple(d if isinstance(d, int) and d >= 0 else 2 for d in info.shape)
        if int(np.prod(shape, dtype=np.float64)) > MAX_FEED:
            return None
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(info.elem_type))
        except Exception:  # noqa: BLE001 - an element type numpy has no name for: nothing to feed
            return None
        feeds[name] = (rng.standard_normal(shape) if dtype.kind == "f" else np.zeros(shape)).astype(dtype) \
            if dtype.kind in "fiub" else None
        if feeds[name] is None:
            return None
    return feeds


def exercise(data: bytes) -> str:
    """'loaded' or 'refused'; raises what escapes."""
    import engine
    from engine.errors import OnnxGradError

    try:
        model = engine.load(data)
    except OnnxGradError as exc:
        _one_line(exc)
        return "refused"
    feeds = feeds_for(model)
    if feeds is None:
        return "loaded"
    for call in (_run, _gradient):
        try:
            call(model, feeds)
        except OnnxGradError as exc:
            _one_line(exc)
    return "loaded"


def _run(model, feeds):
    model.run(feeds)


def _gradient(model, feeds):
    floats = [n for n, t in model.graph.initializers.items() if t.data_type == TensorProto.FLOAT]
    floats += [n for n, v in feeds.items() if v.dtype.kind == "f"]
    if model.outputs and floats:
        model.gradient(model.outputs[0], floats[:1], [n for n in feeds if n != floats[0]], feeds=feeds)


def _one_line(exc: BaseException) -> None:
    if "\n" in str(exc) or not str(exc).strip():
        raise AssertionError(f"{type(exc).__name__} not on one line: {str(exc)[:300]!r}")


def sample_models(patterns: tuple[str, ...] = ()) -> list[tuple[str, bytes]]:
    """The models to mutate: sample_models/*.onnx, or the files the glob `patterns` match."""
    patterns = patterns or (os.path.join(ROOT, "sample_models", "*.onnx"),)
    paths = sorted({p for pattern in patterns for p in glob.glob(pattern, recursive=True)})
    base = os.path.commonpath([os.path.dirname(p) for p in paths]) if paths else ""
    return [(os.path.relpath(p, base), open(p, "rb").read()) for p in paths]


def case_list(n_bytes: int, n_protos: int, seed: int) -> list[tuple[str, int, float]]:
    """(kind, k, the case's own seed) per case, byte-level first: case i is the same case however many
    cases a run makes or skips (benchmarks/fuzz_models.py runs slices of this list in child processes)."""
    rng = random.Random(seed)
    kinds = [("bytes", k) for k in range(n_bytes)] + [("proto", k) for k in range(n_protos)]
    return [(kind, k, rng.random()) for kind, k in kinds]


def mutant(originals: list[tuple[str, bytes]], kind: str, k: int, case_seed: float) -> tuple[str, bytes]:
    """(the sample model's name, the mutated bytes) of one case of `case_list`."""
    name, data = originals[k % len(originals)]
    case_rng = random.Random(case_seed)
    if kind == "bytes":
        return name, byte_mutation(data, case_rng)
    return name, proto_mutation(onnx.load_from_string(data), case_rng)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=200)
    p.add_argument("--protos", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-gb", type=float, default=4.0)
    args = p.parse_args(argv)
    if args.memory_gb:
        cap = int(args.memory_gb * 2**30)
        import torch  # noqa: F401 - its start-up reservations come before the cap

        used = _address_space()
        resource.setrlimit(resource.RLIMIT_AS, (used + cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    warnings.simplefilter("ignore")
    originals = sample_models()
    cases = case_list(args.bytes, args.protos, args.seed)
    counts = {"loaded": 0, "refused": 0}
    escapes = []
    for kind, k, case_seed in cases:
        name, mutated = mutant(originals, kind, k, case_seed)
        try:
            counts[exercise(mutated)] += 1
        except (Exception, MemoryError) as exc:  # noqa: BLE001 - an escape: report it, keep fuzzing
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            escapes.append(f"{kind} #{k} of {name}: {type(exc).__name__}: {first}")
    print(json.dumps({"cases": len(cases), **counts, "escapes": escapes}))
    return 0


def _address_space() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


if __name__ == "__main__":
    sys.exit(main())
