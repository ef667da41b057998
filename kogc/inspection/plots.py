"""Figures: the profiled step's timeline (PNG) and one layer's task graph (SVG/PNG through matplotlib, or
Graphviz DOT text). matplotlib is an optional dependency (`pip install 'kogc[inspect]'`); the figures use
its object API (Figure, no pyplot), so no GUI backend is touched."""
from __future__ import annotations

import os

import numpy as np

from ..errors import KogcError
from ..runtime.profile import kind_key
from . import costs

# distinct colours, in the order kinds first appear in a schedule (task ids follow the model)
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#393b79",
           "#843c39", "#e7ba52", "#5254a3", "#637939", "#7b4173", "#bcbd22", "#31a354", "#fd8d3c", "#6baed6",
           "#ad494a", "#636363"]

MARGIN_PX = {"left": 100, "right": 30, "top": 150, "bottom": 70}
DPI = 100


def require_matplotlib(what: str):
    """matplotlib, or a KogcError naming what needs it and how to install it."""
    try:
        import matplotlib
        import matplotlib.figure      # (what the figures are drawn on: a partial install fails here)
    except ImportError:
        raise KogcError(f"{what} needs matplotlib: pip install 'kogc[inspect]'") from None
    return matplotlib


def kind_colours(schedule) -> dict[str, str]:
    out: dict[str, str] = {}
    for t in schedule.tasks:
        k = kind_key(t)
        if k not in out:
            out[k] = PALETTE[len(out) % len(PALETTE)]
    return out


def timeline_size(rows: int, width_px: int = 2400, row_px: float = 6) -> tuple[int, int]:
    """The PNG's size in pixels for `rows` programs."""
    return int(width_px), int(round(MARGIN_PX["top"] + MARGIN_PX["bottom"] + rows * row_px))


def _tick_step(row_px: float, min_px: float = 14) -> int:
    for k in (1, 2, 5, 10, 20, 25, 50, 100, 200, 500, 1000):
        if k * row_px >= min_px:
            return k
    return 1000


def _save(fig, path: str, what: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise KogcError(f"{what} {path}: no folder {d}")
    import matplotlib
    try:
        with matplotlib.rc_context({"svg.fonttype": "none"}):     # SVG text stays text (searchable, small)
            fig.savefig(path, dpi=DPI)
    except (OSError, ValueError) as e:
        raise KogcError(f"{what} {path}: {e}") from None


def timeline(ins, prof, path: str, programs: range | None = None, window: tuple[float, float] | None = None,
             width_px: int = 2400, row_px: float = 6, title: str | None = None) -> dict:
    """The PNG timeline of a profiled step: one row per program (program 0 at the top), x = us; each task a
    bar from its start to its end, coloured by kind: its wait (start to after the waits) hatched and pale,
    its body solid. Dashed lines where each layer's last task ends. Returns what was drawn: rows
    (programs), bars, size (pixels), layer ends."""
    mpl = require_matplotlib("the timeline (--png)")
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.transforms import blended_transform_factory

    from .profiled import layer_ends
    s = ins.schedule
    programs = programs if programs is not None else range(len(s.queues))
    rows = list(programs)
    span = prof.span_us
    x0, x1 = window if window is not None else (0.0, span)
    W, H = timeline_size(len(rows), width_px, row_px)
    colours = kind_colours(s)
    body: dict[str, list] = {k: [] for k in colours}
    wait: dict[str, list] = {k: [] for k in colours}
    half = 0.4
    for y, p in enumerate(rows):
        for tid in s.queues[p]:
            a, b, c = (prof.ts[prof.row[tid], :3] / 1e3).tolist()
            if c < x0 or a > x1:
                continue
            k = kind_key(s.tasks[tid])
            if b > a:
                wait[k].append(((a, y - half), (a, y + half), (b, y + half), (b, y - half)))
            body[k].append(((b, y - half), (b, y + half), (max(c, b + 1e-3), y + half), (max(c, b + 1e-3), y - half)))
    fig = Figure(figsize=(W / DPI, H / DPI), dpi=DPI)
    m = MARGIN_PX
    ax = fig.add_axes((m["left"] / W, m["bottom"] / H, (W - m["left"] - m["right"]) / W,
                       (H - m["top"] - m["bottom"]) / H))
    bars = 0
    with mpl.rc_context({"hatch.linewidth": 0.6, "hatch.color": "0.35"}):
        for k, c in colours.items():
            if wait[k]:
                ax.add_collection(PolyCollection(np.array(wait[k]), facecolors=[mpl.colors.to_rgba(c, 0.22)],
                                                 edgecolors="none", linewidths=0))
                bars += len(wait[k])
            if body[k]:
                ax.add_collection(PolyCollection(np.array(body[k]), facecolors=[c], edgecolors="none",
                                                 linewidths=0))
                bars += len(body[k])
        _hatch(ax, wait, colours, (x0, x1), len(rows), (W - m["left"] - m["right"], H - m["top"] - m["bottom"]))
        ax.set_xlim(x0, x1)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        step = _tick_step(row_px)
        major = [i for i, p in enumerate(rows) if p % step == 0]
        ax.set_yticks(major, [str(rows[i]) for i in major], fontsize=7)
        ax.set_yticks(range(len(rows)), minor=True)
        ax.tick_params(axis="y", which="minor", length=2, width=0.3)
        ax.set_ylabel("program")
        ax.set_xlabel("time in the step (us)")
        ax.grid(axis="x", color="0.85", lw=0.5)
        ax.set_axisbelow(True)
        ends = layer_ends(ins, prof)
        tr = blended_transform_factory(ax.transData, ax.transAxes)
        for layer, e in ends.items():
            if x0 <= e <= x1:
                ax.axvline(e, color="0.2", lw=0.7, ls="--", zorder=3)
                ax.text(e, 1.002, f"L{layer}", transform=tr, fontsize=7, ha="center", va="bottom")
        if x0 <= span <= x1:
            ax.axvline(span, color="black", lw=1.0, zorder=3)
        handles = [Patch(facecolor=c, label=k) for k, c in colours.items()]
        handles.append(Patch(facecolor="white", edgecolor="0.35", hatch="//////", label="waiting (hatched)"))
        ncol = min(len(handles), max(1, (W - 100) // 300))
        fig.legend(handles=handles, loc="upper center", ncol=ncol, fontsize=9, frameon=False,
                   bbox_to_anchor=(0.5, 1 - 34 / H))
        fig.suptitle(title or f"{ins.where}: {len(s.tasks)} tasks on {len(s.queues)} programs, step span {span:.1f} "
                     f"us; rows: programs {rows[0]}..{rows[-1]}; dashed: each layer's last task ends",
                     y=1 - 8 / H, fontsize=12, va="top")
        _save(fig, path, "--png")
    return {"rows": rows, "bars": bars, "size": (W, H), "layer_ends": ends,
            # (matplotlib drops the minor ticks that fall on a labelled one)
            "row_ticks": sorted({float(y) for y in ax.get_yticks()} | {float(y) for y in ax.get_yticks(minor=True)}),
            "ylim": tuple(float(y) for y in ax.get_ylim())}


def _hatch(ax, rects: dict[str, list], colours: dict[str, str], xlim: tuple[float, float], nrows: int,
           size_px: tuple[int, int], every: int = 4) -> None:
    """Hatch the wait bars: diagonal lines in the kind's colour, drawn as one image over the axes at its
    pixel size (matplotlib's own hatching draws each of 100k+ bars separately: minutes)."""
    import matplotlib.colors as mcolors
    w, h = size_px
    kind_at = np.zeros((h, w), dtype=np.int16)
    sx = w / (xlim[1] - xlim[0])
    for i, k in enumerate(colours, start=1):
        for (a, ylo), _, (b, _), _ in rects[k]:
            c0, c1 = int(max(0, (a - xlim[0]) * sx)), int(min(w, np.ceil((b - xlim[0]) * sx)))
            r0 = int(round((ylo + 0.5) / nrows * h))
            r1 = int(round((ylo + 0.5 + 0.8) / nrows * h))
            if c1 > c0 and r1 > r0:
                kind_at[r0:r1, c0:c1] = i
    rr, cc = np.indices((h, w))
    lines = ((rr + cc) % every == 0) & (kind_at > 0)
    palette = np.zeros((len(colours) + 1, 4))
    for i, c in enumerate(colours.values(), start=1):
        palette[i] = (*(0.7 * np.array(mcolors.to_rgb(c))), 1.0)      # the kind's colour, darker
    rgba = palette[np.where(lines, kind_at, 0)]
    ax.imshow(rgba, extent=(xlim[0], xlim[1], nrows - 0.5, -0.5), aspect="auto", interpolation="nearest",
              zorder=2.5)


def layer_graph(ins, layer: int) -> tuple[object, list[tuple]]:
    """One layer's task graph, one node per (fused op, lane) (the tasks of a group publish to one event),
    an edge where a group waits on another's event; producers outside the layer are nodes marked
    external. Returns the networkx DiGraph and the layer chain's groups in order."""
    import networkx as nx
    s = ins.schedule
    us = costs.task_us(ins)
    groups = costs.groups_of_layer(ins, layer)
    of = {tid: key for key, ids in groups.items() for tid in ids}
    G = nx.DiGraph()
    for key, ids in groups.items():
        t = s.tasks[ids[0]]
        G.add_node(key, op=key[0], lane=key[1], kind=kind_key(t), tasks=len(ids), us=sum(us[x] for x in ids) / len(ids),
                   external=False, ids=ids)
    for key, ids in groups.items():
        for g in sorted({g for tid in ids for g, _ in s.tasks[tid].waits}):
            for src in {(s.tasks[p].op, s.tasks[p].lane) for p in s.events[g].tasks}:
                if src not in G:
                    p0 = next(p for p in s.events[g].tasks if (s.tasks[p].op, s.tasks[p].lane) == src)
                    t = s.tasks[p0]
                    G.add_node(src, op=src[0], lane=src[1], kind=kind_key(t), tasks=0, us=0.0, external=True,
                               ids=[], layer=t.layer)
                G.add_edge(src, key, event=g)
    c = costs.chain(ins, us, set(of))
    path: list[tuple] = []
    for tid in c["path"]:
        if not path or path[-1] != of[tid]:
            path.append(of[tid])
    return G, path


def _label(d: dict) -> str:
    if d["external"]:
        layer = "-" if d.get("layer") is None else d["layer"]
        return f"{d['op']} lane {d['lane']}\n{costs.short_kind(d['kind'])}\n(layer {layer})"
    return (f"{d['op']} lane {d['lane']}\n{costs.short_kind(d['kind'])}\n"
            f"{d['tasks']} task{'s' * (d['tasks'] > 1)}, {d['us']:.2f} us each")


def write_dot(G, path: list, title: str, out: str) -> None:
    """The graph as Graphviz DOT text (render it with `dot -Tsvg` where Graphviz is installed)."""
    on = set(zip(path, path[1:]))
    ids = {n: f"n{i}" for i, n in enumerate(G.nodes)}
    lines = ["digraph layer {", f'  label="{title}"; labelloc=t; rankdir=LR; node [shape=box, fontsize=10];']
    for n, d in G.nodes(data=True):
        style = ', style=dashed, color=gray' if d["external"] else (', color=red, penwidth=2' if n in path else '')
        label = _label(d).replace("\n", "\\n")
        lines.append(f'  {ids[n]} [label="{label}"{style}];')
    for a, b, d in G.edges(data=True):
        style = ", color=red, penwidth=2" if (a, b) in on else ""
        lines.append(f'  {ids[a]} -> {ids[b]} [tooltip="event {d["event"]}"{style}];')
    lines.append("}")
    try:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")
    except OSError as e:
        raise KogcError(f"--graph {out}: {e.strerror}") from None


def draw_graph(G, path: list, title: str, out: str, colours: dict[str, str]) -> dict:
    """The graph drawn with matplotlib (SVG, PNG or PDF by the file's suffix): columns by topological
    generation (producers from other layers first), the layer's chain in red."""
    mpl = require_matplotlib("the layer graph (--graph " + os.path.basename(out) + ")")
    import networkx as nx
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch
    ext = [n for n, d in G.nodes(data=True) if d["external"]]
    inner = G.subgraph([n for n in G.nodes if n not in ext])
    cols = [sorted(ext, key=lambda n: (n[1], n[0]))] if ext else []
    cols += [sorted(g, key=lambda n: (n[1], n[0])) for g in nx.topological_generations(inner)]
    pos = {}
    for x, col in enumerate(cols):
        for y, n in enumerate(col):
            pos[n] = (x * 3.2, -y * 1.0)
    height = max(len(c) for c in cols)
    fig = Figure(figsize=(max(6.0, len(cols) * 3.2 + 1), max(3.0, height * 1.0 + 1.2)), dpi=DPI)
    ax = fig.add_axes((0.01, 0.01, 0.98, 1 - 0.9 / fig.get_figheight()))
    ax.set_xlim(-1.6, (len(cols) - 1) * 3.2 + 1.6)
    ax.set_ylim(-(height - 1) - 0.6, 0.6)
    ax.axis("off")
    on = set(zip(path, path[1:]))
    for a, b in G.edges:                  # from the right side of a box to the left side of the next,
        red = (a, b) in on                 # under the (opaque) boxes
        ax.annotate("", xy=(pos[b][0] - 1.3, pos[b][1]), xytext=(pos[a][0] + 1.3, pos[a][1]), zorder=1 + red,
                    arrowprops=dict(arrowstyle="-|>", color="red" if red else "0.55", lw=1.6 if red else 0.6,
                                    shrinkA=0, shrinkB=0, mutation_scale=8))
    for n, d in G.nodes(data=True):
        x, y = pos[n]
        rgb = np.array(mpl.colors.to_rgb("0.9" if d["external"] else colours.get(d["kind"], "0.8")))
        colour = rgb if d["external"] else 0.45 * rgb + 0.55       # the kind's colour, paler, opaque
        ax.add_patch(FancyBboxPatch((x - 1.3, y - 0.38), 2.6, 0.76, boxstyle="round,pad=0.02",
                                    facecolor=colour,
                                    edgecolor="red" if n in path else "0.3", lw=1.8 if n in path else 0.6,
                                    ls="--" if d["external"] else "-", zorder=3))
        ax.text(x, y, _label(d), ha="center", va="center", fontsize=7, zorder=4)
    fig.suptitle(title, fontsize=10, y=1 - 0.15 / fig.get_figheight(), va="top")
    _save(fig, out, "--graph")
    return {"nodes": G.number_of_nodes(), "edges": G.number_of_edges(), "columns": len(cols)}


def write_layer_graph(ins, layer: int, out: str) -> dict:
    """--layer I --graph OUT: .dot/.gv writes Graphviz DOT text (no renderer needed); .svg, .png, .pdf
    draw it with matplotlib."""
    G, path = layer_graph(ins, layer)
    us = costs.task_us(ins)
    c = costs.chain(ins, us, {tid for ids in costs.groups_of_layer(ins, layer).values() for tid in ids})
    inner = sum(not d["external"] for _, d in G.nodes(data=True))
    title = (f"{ins.where}: layer {layer}, {inner} groups (fused op, lane), {G.number_of_nodes() - inner} producers "
             f"from outside (dashed); red: the layer's chain "
             f"through the waits, {c['us']:.1f} us in the cost model")
    suffix = os.path.splitext(out)[1].lower()
    if suffix in (".dot", ".gv"):
        write_dot(G, path, title, out)
        return {"nodes": inner, "external": G.number_of_nodes() - inner, "edges": G.number_of_edges(),
                "format": "dot"}
    if suffix not in (".svg", ".png", ".pdf"):
        raise KogcError(f"--graph {out}: give a .svg, .png or .pdf (drawn with matplotlib) or a .dot (Graphviz text)")
    res = draw_graph(G, path, title, out, kind_colours(ins.schedule))
    res.update(format=suffix[1:], nodes=inner, external=G.number_of_nodes() - inner)
    return res
