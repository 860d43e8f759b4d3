"""A seeded fuzz of integer attributes (issue 35): every integer attribute of every registered op that has a
test case (onnx's node test cases, the contrib conformance cases), and each element of every integer
list, set to ±2³¹, 2³¹ − 1, 0 and the rank ± 1, then loaded, run and (where the op has a gradient)
differentiated under an address-space cap.

The original case runs, and a mutant differs from it in one attribute only, so a mutant the engine
refuses must be refused for that attribute: every failure is one line, an OnnxGradError, and names the
attribute. Anything else is an escape (a traceback, a failure that blames something else, a hang).

    python tests/attribute_fuzz.py [--seed 0] [--limit N] [--memory-gb 4]

prints one JSON line of counts; benchmarks/fuzz_attributes.py runs every mutant and keeps the record.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import signal
import sys
import warnings
from dataclasses import dataclass

import onnx
from onnx import AttributeProto, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS_PER_MUTANT = 20  # a mutant that takes longer is a hang (a loop the attribute made long)


def values_for(rank: int) -> tuple[int, ...]:
    """±2³¹, 2³¹ − 1, 0 and rank ± 1 (negative too: an axis counts from the end)."""
    return tuple(dict.fromkeys((2**31, -2**31, 2**31 - 1, 0, rank + 1, rank - 1, -rank - 1)))


@dataclass(frozen=True)
class Case:
    """One test case that runs: a one-node model and its feeds."""

    name: str
    model: onnx.ModelProto
    feeds: dict
    node: int = 0  # the node whose attributes mutate
    rank: int | None = None  # its first input's rank, when the feeds do not say it

    @property
    def op_type(self) -> str:
        return self.model.graph.node[self.node].op_type


@dataclass(frozen=True)
class Mutant:
    case: Case
    attribute: str
    index: int | None  # the element of an integer list; None for an INT (or a list set whole)
    value: int

    @property
    def label(self) -> str:
        at = "" if self.index is None else f"[{self.index}]"
        return f"{self.case.name}: {self.attribute}{at} = {self.value}"

    def model_bytes(self) -> bytes:
        m = onnx.ModelProto()
        m.CopyFrom(self.case.model)
        node = m.graph.node[self.case.node]
        for a in node.attribute:
            if a.name == self.attribute:
                if a.type == AttributeProto.INT:
                    a.i = self.value
                else:
                    a.ints[self.index] = self.value
                break
        else:  # an attribute the case leaves at its default
            node.attribute.append(onnx.helper.make_attribute(self.attribute, self.value))
        return m.SerializeToString()


def node_test_cases() -> list[Case]:
    """onnx's single-node test cases whose op the engine registers at the case's opset."""
    from engine.conformance.cases import node_cases, opset_of
    from engine.registry import lookup

    out = []
    for c in node_cases():
        graph = c.model.graph
        if len(graph.node) != 1 or not c.data_sets:
            continue
        node = graph.node[0]
        if lookup(node.domain, node.op_type, opset_of(c.model, node.domain)) is None:
            continue
        names = [i.name for i in graph.input]
        feeds = dict(zip(names, c.data_sets[0][0]))
        out.append(Case(c.name, c.model, feeds))
    return out


def sample_cases() -> list[Case]:
    """Every node of every sample model (sample_models/*.onnx), in its model, fed its inputs' own values."""
    import glob

    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "sample_models", "*.onnx"))):
        model = onnx.load(path)
        inferred = onnx.shape_inference.infer_shapes(model)
        ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in
                 list(inferred.graph.value_info) + list(inferred.graph.input) if v.type.tensor_type.HasField("shape")}
        given = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        feeds = {i.name: given[i.name] for i in model.graph.input if i.name in given}
        for k, node in enumerate(model.graph.node):
            if node.op_type != "Gradient" and any(a.type in (AttributeProto.INT, AttributeProto.INTS)
                                                  for a in node.attribute):
                name = f"{os.path.basename(path)}:{node.name or k}"
                out.append(Case(name, model, feeds, k, ranks.get(node.input[0]) if node.input else None))
    return out


def contrib_cases() -> list[Case]:
    """The contrib conformance cases, their outputs typed by what onnxruntime computes (the checker wants types)."""
    from engine.conformance.contrib import case_model, expected
    from engine.conformance.contrib_cases import all_cases

    out = []
    for c in all_cases():
        try:
            want = expected(c, "float32")
        except Exception:  # noqa: BLE001 - onnxruntime has no kernel for this form: no types to give
            continue
        out.append(Case(c.name, case_model(c, "float32", want), c.feeds()))
    return out


def runs(case: Case) -> bool:
    """Whether the unmutated case loads, runs and differentiates (a mutant of one that does not says nothing)."""
    return exercise(Mutant(case, "", None, 0), mutate=False)[0] == "ran"


def mutants_of(case: Case) -> list[Mutant]:
    """Every integer attribute of the case's op schema (set or not), each element of a list, at every value."""
    node = case.model.graph.node[case.node]
    rank = case.rank if case.rank is not None else _rank(case)
    ints = {a.name: (a.type, len(a.ints)) for a in node.attribute if a.type in (AttributeProto.INT, AttributeProto.INTS)}
    for name, kind in _schema_ints(node, case.model).items():
        ints.setdefault(name, (kind, 0))
    out = []
    for name, (kind, length) in sorted(ints.items()):
        if kind == AttributeProto.INTS and length == 0:
            continue  # an unset list: its length is a choice of its own, and rank ± 1 elements says nothing more
        for index in (None,) if kind == AttributeProto.INT else range(length):
            out.extend(Mutant(case, name, index, v) for v in values_for(rank))
    return out


def _rank(case: Case) -> int:
    first = next(iter(case.feeds.values()), None)
    return getattr(first, "ndim", 0) if first is not None else 0


def _schema_ints(node, model) -> dict[str, int]:
    from engine.conformance.cases import opset_of

    try:
        schema = onnx.defs.get_schema(node.op_type, opset_of(model, node.domain), node.domain)
    except Exception:  # noqa: BLE001 - a contrib op onnx does not know: the attributes the case sets
        return {}
    return {n: a.type for n, a in schema.attributes.items() if a.type in (AttributeProto.INT, AttributeProto.INTS)}


def exercise(mutant: Mutant, mutate: bool = True) -> tuple[str, str]:
    """(outcome, message): 'ran', 'named' (refused naming the attribute), 'downstream' (a later node of a whole
    model refused what the mutated node now makes), 'unnamed' or 'escape'."""
    import engine
    from engine.errors import OnnxGradError

    try:
        with _deadline(SECONDS_PER_MUTANT):
            model = engine.load(mutant.model_bytes() if mutate else mutant.case.model.SerializeToString())
            model.run(mutant.case.feeds)
            _gradient(model, mutant.case)
    except OnnxGradError as exc:
        msg = str(exc)
        if "\n" in msg or not msg.strip():
            return "escape", f"{type(exc).__name__} not on one line: {msg[:300]!r}"
        named = re.search(rf"(?<![\w.]){re.escape(mutant.attribute)}(?![\w])", msg)
        node = mutant.case.model.graph.node[mutant.case.node]
        elsewhere = msg.startswith("node '") and node.name and not msg.startswith(f"node {node.name!r}")
        return ("named" if named else "downstream" if elsewhere else "unnamed"), msg
    except (Exception, MemoryError) as exc:  # noqa: BLE001 - an escape: say what it was
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        return "escape", f"{type(exc).__name__}: {first}"
    return "ran", ""


def _gradient(model, case: Case) -> None:
    from engine.registry import record

    node = case.model.graph.node[case.node]
    rec = record(node.op_type, node.domain)
    if rec is None or rec.no_gradient or rec.rule is None:
        return
    floats = [n for n, v in case.feeds.items() if getattr(v, "dtype", None) is not None and v.dtype.kind == "f"]
    if not floats or not model.outputs:
        return
    y = model.outputs[0]
    if case.model.graph.output[0].type.WhichOneof("value") != "tensor_type":
        return  # a sequence or map: the Gradient operator's y is a tensor
    model.gradient(y, floats[:1], [n for n in case.feeds if n != floats[0]], feeds=case.feeds)


class Hang(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: int):
    def alarm(*_):
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def address_space_cap(gb: float):
    """This process may map only `gb` more GiB while inside (a mutant asking for more fails, one line)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as fh:
        used = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    cap = used + int(gb * 2**30)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def sweep(mutants: list[Mutant], memory_gb: float = 4.0, progress: str = "") -> dict:
    import torch  # noqa: F401 - its start-up reservations come before the cap

    counts = {"ran": 0, "named": 0, "downstream": 0, "unnamed": 0, "escape": 0}
    found: dict[str, list[str]] = {"unnamed": [], "escape": []}
    verdicts: dict[int, bool] = {}  # id(case) -> whether the unmutated case runs
    skipped = 0
    with warnings.catch_warnings(), address_space_cap(memory_gb):
        warnings.simplefilter("ignore")
        for i, m in enumerate(mutants):
            if progress:  # the mutant under way, for a parent to name if this process dies
                with open(progress, "w") as fh:
                    fh.write(f"{i}\t{m.label}")
            if id(m.case) not in verdicts:
                verdicts[id(m.case)] = runs(m.case)
            if not verdicts[id(m.case)]:
                skipped += 1
                _record(progress, "skipped", m, "")
                continue
            outcome, msg = exercise(m)
            _record(progress, outcome, m, msg)
            counts[outcome] += 1
            if outcome in found:
                found[outcome].append(f"{m.label}: {msg[:240]}")
    return {"mutants": len(mutants) - skipped, "of_cases_that_fail_unmutated": skipped, **counts, **found}


def _record(progress: str, outcome: str, m: Mutant, msg: str) -> None:
    """One JSON line per mutant beside the progress file: what a parent counts when this process is killed."""
    if progress:
        with open(progress + ".jsonl", "a") as fh:
            fh.write(json.dumps({"outcome": outcome, "label": m.label, "message": msg[:240]}) + "\n")


def all_mutants(node_cases: bool = True) -> list[Mutant]:
    """Mutants of the sample models' nodes and the contrib cases, and of onnx's node test cases (collecting
    those takes onnx 10-20 s: the suite's seeded run leaves them to benchmarks/fuzz_attributes.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = sample_cases() + contrib_cases() + (node_test_cases() if node_cases else [])
    return [m for c in cases for m in mutants_of(c)]


def seeded_subset(mutants: list[Mutant], n: int, seed: int) -> list[Mutant]:
    """`n` mutants, at least one per (op, attribute) pair while they last, chosen with `seed`."""
    rng = random.Random(seed)
    by_pair: dict[tuple, list[Mutant]] = {}
    for m in mutants:
        by_pair.setdefault((m.case.op_type, m.attribute), []).append(m)
    first = [rng.choice(group) for group in by_pair.values()]
    rng.shuffle(first)
    if len(first) >= n:
        return first[:n]
    chosen = {id(m) for m in first}
    rest = [m for m in mutants if id(m) not in chosen]
    return first + rng.sample(rest, min(n - len(first), len(rest)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=0, help="a seeded subset of this many mutants (0: all)")
    p.add_argument("--memory-gb", type=float, default=4.0)
    p.add_argument("--start", type=int, default=0, help="skip the first START mutants (a parent restarting after a kill)")
    p.add_argument("--progress", default="", help="a file this run writes the index of the mutant under way to")
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    mutants = all_mutants()
    if args.limit:
        mutants = seeded_subset(mutants, args.limit, args.seed)
    result = sweep(mutants[args.start:], args.memory_gb, args.progress)
    pairs = {(m.case.op_type, m.attribute) for m in mutants}
    print(json.dumps({**result, "total": len(mutants), "ops": len({op for op, _ in pairs}), "op_attribute_pairs": len(pairs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
