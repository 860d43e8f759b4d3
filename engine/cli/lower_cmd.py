"""onnxgrad lower MODEL -o OUT.onnx: Gradient nodes (or a selection) rewritten as plain ai.onnx ops."""
from __future__ import annotations

from .common import add_model_argument


def add_parser(sub) -> None:
    p = sub.add_parser(
        "lower", help="write a copy of MODEL whose gradients any ONNX runtime computes",
        description="Replace every Gradient node of MODEL (nested ones too) by standard ai.onnx ops; with --y and "
                    "--xs, also add the gradients of that selection as graph outputs named d{y}_d{x}; with --jvp, "
                    "add the JVP of y along new tangent inputs t_{x} as an output jvp_{y} instead.")
    add_model_argument(p, ops=False)  # lowering writes ONNX ops: a custom op has no lowering
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx", help="where to write the lowered model")
    p.add_argument("--y", help="the tensor to differentiate (adds gradients as new outputs)")
    p.add_argument("--xs", help="comma-separated tensors to differentiate with respect to")
    p.add_argument("--zs", default="", help="comma-separated tensors held fixed; 'inputs' stands for every graph "
                                            "input not in xs")
    p.add_argument("--names", help="comma-separated names of the gradient outputs (default d{y}_d{x}); with --jvp, "
                                   "the name of the JVP output (default jvp_{y})")
    p.add_argument("--dy", nargs="?", const=True, metavar="NAME",
                   help="seed with a new graph input NAME (default d{y}) instead of ones")
    p.add_argument("--jvp", action="store_true",
                   help="forward mode: J·v of y along one tangent input per x, computed beside the forward pass")
    p.add_argument("--tangents", metavar="NAMES", help="with --jvp: comma-separated names of the tangent inputs "
                                                       "(default t_{x})")
    p.set_defaults(handler=run)


def run(args) -> int:
    import os

    from ..errors import LoweringError
    from ..gradient.selection import names as split_names
    from ..lowering.build import lowered
    from ..modelfile.writer import write

    if (args.y is None) != (args.xs is None):
        raise LoweringError("--y and --xs go together: name the tensor and what to differentiate it by")
    if args.dy and args.y is None:
        raise LoweringError("--dy seeds a selection: give --y and --xs too")
    if args.jvp and (args.y is None or args.dy):
        raise LoweringError("--jvp needs --y and --xs, and takes tangent inputs, not --dy")
    if args.tangents and not args.jvp:
        raise LoweringError("--tangents names the tangent inputs of --jvp")
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):
        raise LoweringError(f"cannot write {args.output}: folder {folder} does not exist")
    if args.jvp:
        from ..lowering.jvp import lowered_jvp

        model, weights = lowered_jvp(args.model, args.y, args.xs, args.zs, tangents=args.tangents, name=args.names)
    else:
        model, weights = lowered(args.model, args.y, args.xs, args.zs, dy=args.dy, names=args.names)
    external = write(model, weights, args.output)
    kinds = sorted({n.op_type for n in model.graph.node})
    outputs = ", ".join(o.name for o in model.graph.output)
    print(f"wrote {args.output}: {len(model.graph.node)} nodes, {len(kinds)} op types, opset "
          f"{next(o.version for o in model.opset_import if o.domain in ('', 'ai.onnx'))}")
    print(f"outputs: {outputs}")
    if args.jvp:  # lowered_jvp declares them last, one per x
        n_xs = len(split_names(args.xs))
        print(f"tangent inputs: {', '.join(i.name for i in list(model.graph.input)[-n_xs:])}")
    if external:
        print(f"weights: {args.output}.data (external data: the model is over protobuf's 2 GB)")
    return 0
