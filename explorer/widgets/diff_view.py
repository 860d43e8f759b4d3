"""The inspector's part in diff mode: the node's verdict (error, local error, tolerance), A's and B's
values side by side, and a histogram of their differences |a − b| in log-spaced (decade) bins."""
from __future__ import annotations

import math

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..diff_state import GRADIENT

PAIRS = 2  # tensors shown per node: more are a key away (o, next tensor)
WORST = 4  # elements listed by |a - b|
DECADES = 7  # histogram rows of nonzero differences: smaller ones are counted in the lowest
BAR = 14  # cells of the longest bar
# Elements looked at per tensor, on the UI thread (~25 ms): a bigger one is summed up from a strided sample.
SAMPLE = 1 << 18
VERDICTS = {"fail": ("✗ diverges by itself", "bold red"),
            "inconclusive": ("≈ carries a difference from upstream", "yellow"),
            "pass": ("✓ agrees within tolerance", "green")}


def diff_section(diff, graph, node_index: int | None, tensor: str | None, stale: bool = False) -> Group:
    """What diff mode adds to the inspector for the node and tensor under the cursor."""
    parts = [Text(f"diff, {diff.where}, {diff.label}", style="bold reverse")]
    if stale:
        parts.append(Text("stale: computed before the feeds, dims or selection changed", style="bold yellow"))
    tensors = [tensor] if tensor else []
    if node_index is not None:
        name, node = graph.node_names[node_index], graph.nodes[node_index]
        parts.append(_verdict(diff, name))
        if diff.where == GRADIENT:  # what the node sends into its inputs first, then what it received
            tensors = ([tensor] if tensor in node.input else []) + list(node.input) + tensors + list(node.output)
        else:  # its outputs, the cursor's first
            tensors += list(node.output)
    pairs = diff.pairs(t for t in dict.fromkeys(tensors) if t)
    for name, a, b in pairs[:PAIRS]:
        parts.append(_pair(diff, name, a, b))
    if len(pairs) > PAIRS:
        parts.append(Text(f"+{len(pairs) - PAIRS} more: o moves to the node's next tensor", style="dim"))
    if not pairs and tensors:
        kept = "gradient" if diff.where == GRADIENT else "value"
        parts.append(Text(f"no {kept} of {tensors[0]} compared in this diff", style="dim"))
    return Group(*parts)


def _verdict(diff, node: str) -> Text:
    row = diff.row(node)
    t = Text()
    if row is None:
        return Text(f"{node}: not compared ({diff.where})\n", style="dim")
    mark = "fail" if row.diverges else "inconclusive" if row.error > row.tolerance else "pass"
    label, style = VERDICTS[mark]
    t.append(f"{node} ", style="bold")
    t.append(label + "\n", style=style)
    t.append(f"  local error {row.local_error:.3g}\n  tolerance   {row.tolerance:.2g}{' exceeded' if row.diverges else ''}\n")
    t.append(f"  error       {row.error:.3g} accumulated\n", style="dim")
    if row.note:
        t.append(f"  {row.note}\n", style="italic")
    if row.input_errors:
        arrived = ", ".join(f"{name} {err:.2g}" for name, err in row.input_errors[:3])
        t.append(f"  {'inputs' if diff.where != GRADIENT else 'gradients'} arrived: {arrived}\n", style="dim")
    if row.b_nodes and row.b_nodes != (node,):
        t.append(f"  B: {', '.join(row.b_nodes)[:60]}\n", style="dim")
    return t


def _pair(diff, name: str, a: np.ndarray, b: np.ndarray) -> Group:
    key = (diff.where, name)
    cached = diff.cache.get(key)
    if cached is None:
        flat = _flat(a, b)
        cached = diff.cache[key] = Group(_side_by_side(diff, name, a, b, flat), histogram_of_differences(a, b, flat))
    return cached


def _flat(a: np.ndarray, b: np.ndarray):
    """A's and B's elements (a strided sample of a big tensor) as float64, and |a - b|; None if the shapes differ."""
    if a.shape != b.shape:
        return None
    fa, fb = _sampled(a), _sampled(b)
    with np.errstate(all="ignore"):
        return fa, fb, np.abs(fa - fb)


def _side_by_side(diff, name: str, a: np.ndarray, b: np.ndarray, flat) -> Table:
    what = f"d/d{name}" if diff.where == GRADIENT else name
    sampled = f" (a sample of {min(a.size, SAMPLE):,})" if a.size > SAMPLE else ""
    table = Table(title=f"{what} {list(a.shape)}{sampled}", title_justify="left", title_style="bold", box=None,
                  padding=(0, 1), pad_edge=False, show_edge=False)
    for header in ("", "A", "B", "|a−b|"):
        table.add_column(header, justify="right" if header else "left", no_wrap=True)
    if flat is None:
        table.add_row("shapes", str(list(a.shape)), str(list(b.shape)), "")
        return table
    fa, fb, d = flat
    if fa.size == 0:
        return table
    for label, f in (("min", np.nanmin), ("max", np.nanmax), ("mean", np.nanmean)):
        with np.errstate(all="ignore"):
            table.add_row(label, _num(f(fa)), _num(f(fb)), _num(f(d)) if label != "min" else "")
    worst = []
    if a.size <= SAMPLE:  # a sample's positions are not the tensor's indices
        order = np.nan_to_num(d, nan=np.inf)
        top = np.argpartition(-order, min(WORST, order.size - 1))[:WORST]
        worst = top[np.argsort(-order[top], kind="stable")]
    for k in worst:
        index = np.unravel_index(int(k), a.shape) if a.ndim else ()
        table.add_row(f"[{','.join(map(str, index))}]", _num(fa[k]), _num(fb[k]), _num(d[k]), style="dim")
    return table


def histogram_of_differences(a: np.ndarray, b: np.ndarray, flat=None) -> Text:
    """|a − b| per decade: exact zeros, then [1e-k, 1e-k+1) up to the largest, and NaN/Inf apart."""
    t = Text("|a−b| ", style="bold")
    flat = flat if flat is not None else _flat(a, b)
    if flat is None:
        return t.append("not comparable: the shapes differ", style="dim")
    d = flat[2]
    sampled = a.size > SAMPLE
    finite = d[np.isfinite(d)]
    nonfinite = d.size - finite.size
    zeros = int((finite == 0).sum())
    nonzero = finite[finite > 0]
    t.append(f"{d.size:,} elements{' (sampled)' if sampled else ''}\n", style="dim")
    rows: list[tuple[str, int]] = [("= 0", zeros)] if zeros else []
    if nonzero.size:
        decades = np.floor(np.log10(nonzero)).astype(int)
        top = int(decades.max())
        low = max(int(decades.min()), top - DECADES + 1)
        counts = np.bincount(np.clip(decades, low, top) - low, minlength=top - low + 1)
        clipped = low > decades.min()  # the lowest row also counts every smaller difference
        for k, count in enumerate(counts):
            rows.append((f"< 1e{low + 1:+03d}" if k == 0 and clipped else f"≥ 1e{low + k:+03d}", int(count)))
    if nonfinite:
        rows.append(("NaN/Inf", nonfinite))
    most = max((c for _, c in rows), default=0)
    for label, count in rows:
        cells = BAR * count / most if most else 0
        bar = "█" * int(cells) + ("▌" if cells - int(cells) >= 0.5 else "")
        t.append(f"  {label:>8} ", style="dim")
        t.append(f"{bar or ('▏' if count else '')}", style="red" if label == "NaN/Inf" else "cyan")
        t.append(f" {count:,}\n", style="dim")
    return t


def _sampled(a: np.ndarray) -> np.ndarray:
    flat = np.asarray(a, dtype=np.float64).reshape(-1) if a.size <= SAMPLE else \
        np.asarray(a.reshape(-1)[:: math.ceil(a.size / SAMPLE)], dtype=np.float64)
    return flat


def _num(x) -> str:
    x = float(x)
    return f"{x:.4g}" if math.isfinite(x) else str(x)
