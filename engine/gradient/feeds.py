"""Values for tensors: parsing SPEC strings, checking feeds against the model, and the defaults for
tensors nobody fed. The CLI, the explorer and Model.gradient all use these, so they agree.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Protocol

import numpy as np
from onnx import helper

from ..dtypes import to_numpy
from ..errors import FeedError, SelectionError, UnsupportedOpError
from ..modelfile.index import GraphIndex, node_inputs
from .dims import Dims, dims_from_feeds, sized
from .feed_checks import check_feed
from .feed_syntax import SPEC_HELP
from .head_sizes import consumers_through
from .past_feeds import past_plan

if TYPE_CHECKING:
    from .selection import GradientSpec


class ModelValues(Protocol):
    """What the defaults below need of a model (engine.Model is one): its graph, its initializers
    and a forward run that computes intermediates from feeds."""

    graph: GraphIndex

    def constants(self, device=..., dtype=...) -> Mapping[str, object]: ...

    def run(self, feeds: Mapping[str, object] | None = ..., *, outputs=..., device=..., dtype=...
            ) -> dict[str, np.ndarray]: ...


def declared_shape(graph: GraphIndex, name: str, dims: Dims | None = None) -> tuple[int, ...]:
    """The declared shape, symbolic dims sized by `dims` (else 1), unknown ones 1; FeedError when
    the rank is unknown."""
    info = graph.types.get(name)
    if info is None or info.shape is None:
        raise FeedError(f"the shape of {name!r} is unknown; feed it a value ({SPEC_HELP} needs a shape, so use a .npy file)")
    return sized(info.shape, dims)


def declared_dtype(graph: GraphIndex, name: str) -> np.dtype:
    info = graph.types.get(name)
    if info is None or info.elem_type is None:
        return np.dtype(np.float32)
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(info.elem_type))
    except Exception:
        return np.dtype(np.float32)


# Elements drawn per block by `normal_blocks`.
DRAW_BLOCK = 1 << 20


def normal_blocks(seed, size: int):
    """(start, float64 block) pairs covering `default_rng(seed).standard_normal(size)`, DRAW_BLOCK
    elements each: the same numbers as one draw, for a caller that writes each block into a result
    of its own dtype instead of holding the whole float64 draw beside it."""
    rng = np.random.default_rng(seed)
    for start in range(0, size, DRAW_BLOCK):
        yield start, rng.standard_normal(min(DRAW_BLOCK, size - start))


def standard_normal(seed: int, shape, dtype) -> np.ndarray:
    """`default_rng(seed).standard_normal(shape)` cast to `dtype`, drawn a block at a time into the
    result (a random feed of GPT-2's embedding held 0.29 GB of float64 on top of its 0.15 GB)."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return np.random.default_rng(seed).standard_normal(shape)
    out = np.empty(shape, dtype)
    flat = out.reshape(-1)
    for start, block in normal_blocks(seed, flat.size):
        flat[start:start + block.size] = block
        del block  # before the next block is drawn
    return out


def random_value(graph: GraphIndex, name: str, seed: int) -> np.ndarray:
    """Standard-normal floats, or zeros for integer/bool tensors (random indices would be out of range)."""
    shape, dtype = declared_shape(graph, name), declared_dtype(graph, name)
    if dtype.kind == "f":
        return standard_normal(seed, shape, dtype)
    return np.zeros(shape, dtype=dtype)


# Ops an integer tensor passes through unchanged in value on its way to the table it indexes.
INDEX_PASSING = frozenset({"Identity", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Transpose",
                           "Slice", "Tile"})


def index_bound(graph: GraphIndex, name: str) -> int | None:
    """The size of the smallest table `name` indexes (Gather's data along its axis, GatherElements
    likewise, OneHot's depth), following it through reshapes and casts; None when it indexes none."""
    from onnx import helper, numpy_helper

    bounds = []
    for t, i in consumers_through(graph, name, INDEX_PASSING):
        node = graph.nodes[i]
        ins = node_inputs(node)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type in ("Gather", "GatherElements") and len(ins) > 1 and ins[1] == t:
            info = graph.types.get(ins[0])
            axis = int(attrs.get("axis", 0))
            if info is not None and info.shape is not None and -len(info.shape) <= axis < len(info.shape):
                size = info.shape[axis]
                if isinstance(size, int) and size > 0:
                    bounds.append(size)
        elif node.op_type == "OneHot" and ins and ins[0] == t and len(ins) > 1 and ins[1] in graph.initializers:
            depth = numpy_helper.to_array(graph.initializers[ins[1]]).reshape(-1)
            if depth.size and int(depth[0]) > 0:
                bounds.append(int(depth[0]))
    return min(bounds) if bounds else None


def random_integers(graph: GraphIndex, name: str, shape, dtype: np.dtype, seed: int) -> np.ndarray:
    """Uniform over [0, n), n the size of the table `name` indexes (else 2: a valid mask or class)."""
    high = 2 if dtype.kind == "b" else (index_bound(graph, name) or 2)
    if dtype.kind == "u" or dtype.kind == "i":
        high = min(high, np.iinfo(dtype).max + 1)
    return np.random.default_rng(seed).integers(0, high, shape).astype(dtype)


def is_file_spec(spec: str) -> bool:
    """A SPEC that names a .npy file (any path containing a separator or ending in .npy)."""
    spec = spec.strip()
    return spec.endswith(".npy") or os.path.sep in spec


def parse_spec(graph: GraphIndex, name: str, spec: str, default_seed: int = 0, label: str | None = None,
               dims: Dims | None = None) -> np.ndarray:
    """One feed from its SPEC string, symbolic dims sized by `dims`; `label` names the value in
    errors (default: feed 'NAME')."""
    who = label or f"feed {name!r}"
    spec = spec.strip()
    if is_file_spec(spec):
        if not os.path.exists(spec):
            raise FeedError(f"{who}: no such file {spec}")
        _require_magic(spec, b"\x93NUMPY", f"{who}: {spec} is not an .npy file (write one with numpy.save)")
        try:
            value = np.load(spec, allow_pickle=False)
        except Exception as exc:
            raise FeedError(f"{who}: cannot read {spec} as .npy: {exc}") from None
        if label is None:
            check_feed(graph, name, value, dims)
        return value
    try:
        shape, dtype = declared_shape(graph, name, dims), declared_dtype(graph, name)
    except FeedError as exc:
        if label is None:
            raise
        raise FeedError(f"{label}: {exc}") from None
    if spec == "zeros":
        return np.zeros(shape, dtype)
    if spec == "ones":
        return np.ones(shape, dtype)
    if spec == "random" or spec.startswith("random:"):
        seed = default_seed
        if ":" in spec:
            try:
                seed = int(spec.split(":", 1)[1])
            except ValueError:
                raise FeedError(f"{who}: bad seed in {spec!r}; use random:SEED with an integer") from None
        if dtype.kind in "iub":
            return random_integers(graph, name, shape, dtype, seed)
        if dtype.kind != "f":
            raise FeedError(f"{who}: random values need a numeric tensor, {name!r} is {dtype}")
        return standard_normal(seed, shape, dtype)
    try:
        number = float(spec)
    except ValueError:
        raise FeedError(f"{who}: cannot understand {spec!r}; use {SPEC_HELP}") from None
    return np.full(shape, number, dtype)


def _require_magic(path: str, magic: bytes, message: str) -> None:
    # numpy's own error for a text file is advice about pickles; say what the file is not instead.
    with open(path, "rb") as fh:
        if fh.read(len(magic)) != magic:
            raise FeedError(message)


def parse_assignment(text: str) -> tuple[str, str]:
    """NAME=SPEC -> (NAME, SPEC)."""
    if "=" not in text:
        raise FeedError(f"bad feed {text!r}: write NAME=SPEC, SPEC being {SPEC_HELP}")
    name, spec = text.split("=", 1)
    if not name.strip() or not spec.strip():
        raise FeedError(f"bad feed {text!r}: write NAME=SPEC, SPEC being {SPEC_HELP}")
    return name.strip(), spec.strip()


def load_npz(path: str) -> dict[str, np.ndarray]:
    if not os.path.exists(path):
        raise FeedError(f"no such file: {path}")
    _require_magic(path, b"PK", f"{path} is not an .npz file (write one with numpy.savez)")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except Exception as exc:
        raise FeedError(f"cannot read {path} as .npz: {exc}") from None


def gradient_extras(graph: GraphIndex, spec: "GradientSpec", feeds: Iterable[str]) -> tuple[str, ...]:
    """Fed initializers the cut graph reads (overrides, passed after xs and zs); SelectionError for
    a feed computed inside the cut graph, which would silently change what is differentiated."""
    from ..run.pacing import paced
    from ..run.plan import needed_nodes

    members = set(spec.inputs)
    interior, read = set(), set()
    for i in paced(needed_nodes(graph, members, [spec.y])[0]):
        interior.update(t for t in graph.nodes[i].output if t)
        read.update(t for t in node_inputs(graph.nodes[i]) if t)
    bad = sorted(n for n in feeds if n in interior and n not in members)
    if bad:
        raise SelectionError(
            f"feed {bad[0]!r} is computed inside the differentiated graph; "
            "put it in xs or zs to set its value"
        )
    return tuple(sorted(n for n in feeds if n in read and n in graph.initializers and n not in members))


# --- defaults for tensors nobody fed -----------------------------------------------------------
@dataclass(frozen=True)
class Default:
    """A value the engine chose for a tensor nobody fed; `how` is a SPEC or a phrase, `why` says
    why that one when it is not the obvious choice."""

    name: str
    how: str
    why: str = ""

    @property
    def note(self) -> str:
        return f"{self.name} not fed: using {self.how}{f' ({self.why})' if self.why else ''}"


def is_mask_name(name: str) -> bool:
    return "mask" in name.lower()


def default_spec(graph: GraphIndex, name: str, seed: int = 0) -> str:
    """The SPEC a tensor nobody fed gets: `random:S` for floats; for integers and bools `ones`
    when the name says mask (attention_mask: attend everywhere), else `zeros`.

    S is `seed` + 1 + the tensor's position in the model (graph inputs first), so each tensor's
    default is fixed by the model and the seed alone: feeding or selecting another tensor never
    changes it, and the explorer and the CLI draw the same numbers.
    """
    info = graph.types.get(name)
    if info is not None and info.elem_type and not info.is_float:
        return "ones" if is_mask_name(name) else "zeros"
    position = graph.inputs.index(name) if name in graph.inputs else graph.all_tensors().index(name)
    return f"random:{seed + 1 + position}"


def default_reason(graph: GraphIndex, name: str) -> str:
    """Why an integer or bool tensor's default is what it is, and how to get indices instead."""
    info = graph.types.get(name)
    if info is None or not info.elem_type or info.is_float:
        return ""
    if is_mask_name(name):
        return "an integer input named like a mask"
    bound = index_bound(graph, name)
    return f"the integer default; random draws indices over [0, {bound})" if bound else "the integer default"


def defaults_for(model: ModelValues, names: Iterable[str], feeds: Mapping[str, object], *, seed: int = 0,
                 device="cpu", dtype=None, dims: Dims | None = None) -> tuple[dict[str, object], tuple[Default, ...]]:
    """Values for those of `names` that `feeds` lacks: (values, what was chosen).

    1. an initializer takes its value (not listed as a choice);
    2. a graph input takes `default_spec` (random floats; ones for integers named like a mask,
       zeros for other integers and bools), its symbolic dims sized by `dims`, else by the feeds
       that show them, else 1 (`engine.gradient.dims`);
    3. an intermediate takes its forward value, computed from the feeds and these same defaults
       for the graph inputs above it (which are returned too); when its producer cannot run
       (an unsupported op upstream), `default_spec` instead.
    """
    from ..run.plan import needed_nodes

    graph = model.graph
    values: dict[str, object] = {}
    chosen: list[Default] = []
    sizes = dims_from_feeds(graph, feeds, dims)
    llm = past_plan(graph, sizes)  # an LLM with past: past, current and head sizes that agree
    sizes = llm.dims if llm is not None else sizes

    def by_spec(name: str, why: str = "") -> None:
        value, spec, told = None, default_spec(graph, name, seed), ""
        if llm is not None and name in graph.inputs:
            value, spec, told = llm.choose(graph, name, spec, seed)
        values[name] = parse_spec(graph, name, spec, dims=sizes) if value is None else value
        chosen.append(Default(name, spec, why or told or default_reason(graph, name)))

    unfed = [n for n in dict.fromkeys(names) if n not in feeds]
    computed = [n for n in unfed if n in graph.producer]
    upstream = needed_nodes(graph, set(feeds), computed)[1] if computed else []
    for n in dict.fromkeys(upstream + [n for n in unfed if n in graph.inputs]):
        by_spec(n)
    for n in unfed:
        if n in graph.initializers:
            values[n] = to_numpy(model.constants()[n])  # bfloat16 as float32: numpy has none
    if computed:
        base = {**feeds, **{n: values[n] for n in upstream}}
        try:
            values.update(model.run(base, outputs=computed, device=device, dtype=dtype))
            chosen.extend(Default(n, "its forward value") for n in computed)
        except UnsupportedOpError as exc:
            chosen = [d for d in chosen if d.name not in upstream or d.name in unfed]  # not used after all
            for n in computed:
                by_spec(n, f"its forward value needs {exc.op or 'an unsupported op'}")
    return values, tuple(chosen)


def complete_feeds(model: ModelValues, feeds: Mapping[str, object], *, targets: Iterable[str] = (),
                   members: Iterable[str] = (), seed: int = 0, device="cpu", dtype=None, dims: Dims | None = None
                   ) -> tuple[dict[str, object], tuple[Default, ...]]:
    """`feeds` plus a default (`defaults_for`) for every unfed member of xs ∪ zs and every unfed
    graph input that computing `targets` reads; and what was chosen, for the user to see."""
    from ..run.plan import needed_nodes

    members = list(members)
    needed = needed_nodes(model.graph, set(feeds) | set(members), list(targets))[1] if targets else []
    values, chosen = defaults_for(model, members + needed, feeds, seed=seed, device=device, dtype=dtype, dims=dims)
    out = dict(feeds)
    out.update((d.name, values[d.name]) for d in chosen)
    return out, chosen
