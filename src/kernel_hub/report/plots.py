"""Bench plots as SVG text (matplotlib, Agg): per group of a bench, every method's median with its
interquartile range, ours in one colour and the baselines in another, our ratio to the baseline written beside.

The SVG keeps text as text (svg.fonttype none) and names its parts (gid): `<bench>-<group>-median-<method>` is
the median marker, `...-iqr-<method>` the interquartile bar, so a browser test can find them. Deterministic:
no date in the metadata, fixed hash salt for ids.
"""

from __future__ import annotations

import io
import re

from ..verify.timing import Ratio, format_ratio
from .schema import Bench, BenchRecord

OURS_COLOUR = "#d9480f"
BASELINE_COLOUR = "#1c7ed6"
OTHER_COLOUR = "#868e96"


def fmt_ms(v: float) -> str:
    """Milliseconds with three or so significant digits, never in exponent form."""
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 else f"{v:.3f}"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _groups(records: list[BenchRecord]) -> dict[str, list[BenchRecord]]:
    out: dict[str, list[BenchRecord]] = {}
    for r in records:
        out.setdefault(r.group, []).append(r)
    return out


def bench_svg(bench: Bench) -> str | None:
    """The bench's figure as an <svg> element (no XML prolog), or None when it has no timed records."""
    if not bench.records:
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt

    groups = _groups(bench.records)
    heights = [0.3 * len(rs) + 0.2 for rs in groups.values()]
    gap, top, bottom = 0.75, 0.35, 0.55  # inches: between groups (title + axis), above, below
    total = sum(heights) + gap * (len(groups) - 1) + top + bottom
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "kernel-hub", "font.size": 9,
                                "font.family": "sans-serif"}):
        fig, axes = plt.subplots(len(groups), 1, figsize=(10, total), squeeze=False,
                                 gridspec_kw={"height_ratios": heights})
        # left: method names; middle: the axes; right: the notes (median, ratio to the baseline)
        fig.subplots_adjust(left=0.25, right=0.6, top=1 - top / total, bottom=bottom / total,
                            hspace=gap / (sum(heights) / len(groups)))
        for ax, (group, rows) in zip(axes[:, 0], groups.items(), strict=True):
            _group_axes(ax, bench, group, rows)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
        plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _group_axes(ax, bench: Bench, group: str, rows: list[BenchRecord]) -> None:
    prefix = f"{slug(bench.name)}-{slug(group)}"
    labels = []
    ours = [r for r in rows if r.ours]
    best = min(ours, key=lambda r: r.median_ms) if ours else None
    for y, r in enumerate(rows):
        colour = OURS_COLOUR if r.ours else BASELINE_COLOUR if r.method == bench.baseline else OTHER_COLOUR
        bar = ax.plot([r.q1_ms, r.q3_ms], [y, y], color=colour, linewidth=6, alpha=0.35, solid_capstyle="butt")[0]
        bar.set_gid(f"{prefix}-iqr-{slug(r.method)}")
        dot = ax.plot([r.median_ms], [y], "o", color=colour, markersize=6)[0]
        dot.set_gid(f"{prefix}-median-{slug(r.method)}")
        ax.plot([r.min_ms, r.max_ms], [y, y], color=colour, linewidth=0.8, alpha=0.6)
        note = f"{fmt_ms(r.median_ms)} ms"
        if r.ours and r.vs_baseline:
            note += f";  {format_ratio(r.vs_baseline)} vs {bench.baseline}"
        elif best is not None and not r.ours:  # each baseline against our best method in this group
            note += f";  {best.method} {Ratio.of(r.samples_ms, best.samples_ms)} vs this"
        ax.annotate(note, (1.02, y), xycoords=("axes fraction", "data"), va="center", fontsize=8,
                    color=OURS_COLOUR if r.ours else "#212529")
        labels.append(r.method + ("  (baseline)" if r.method == bench.baseline else ""))
    ax.set_yticks(range(len(rows)), labels)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    lo = min(r.min_ms for r in rows)
    hi = max(r.max_ms for r in rows)
    ax.set_xlim(lo / 1.3, hi * 1.3)
    ax.set_title(group, loc="left", fontsize=9, fontweight="bold")
    ax.set_xlabel("ms per call, log scale (dot: median; bar: interquartile range; line: min-max)", fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.25)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def peers_svg(bench: Bench) -> str | None:
    """For a bench of peer rows (kernel, shape, generation, peer, modeled_s, ideal_s): per workload and chip, each
    peer's modeled time as a bar in multiples of the ideal, ours in our colour; None when there are no such rows."""
    rows = [r for r in bench.rows if r.get("peer") and r.get("ideal_s")]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt

    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(f"{r['kernel']} | {r['shape']} | {r['generation']}", []).append(r)
    heights = [0.25 * len(rs) + 0.2 for rs in groups.values()]
    gap, top, bottom = 0.7, 0.35, 0.55
    total = sum(heights) + gap * (len(groups) - 1) + top + bottom
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "kernel-hub", "font.size": 8,
                                "font.family": "sans-serif"}):
        fig, axes = plt.subplots(len(groups), 1, figsize=(10, total), squeeze=False,
                                 gridspec_kw={"height_ratios": heights})
        fig.subplots_adjust(left=0.3, right=0.75, top=1 - top / total, bottom=bottom / total,
                            hspace=gap / (sum(heights) / len(groups)))
        for ax, (group, rs) in zip(axes[:, 0], groups.items(), strict=True):
            for y, r in enumerate(rs):
                ratio = r.get("ratio_to_ideal")
                ours = r["peer"] == "kernel-hub"
                colour = OURS_COLOUR if ours else BASELINE_COLOUR
                gid = f"{slug(bench.name)}-{slug(group)}-bar-{slug(r['peer'])}"
                if ratio is None:
                    ax.text(1.0, y, f"  {str(r.get('compiled') or 'not modeled')[:50]}", va="center", fontsize=7,
                            color=OTHER_COLOUR, gid=gid)
                    continue
                ax.barh(y, ratio, color=colour, gid=gid)
                note = f" {ratio:.2f}x ideal" + ("" if r.get("compiled") == "yes" else " (did not compile)")
                ax.text(ratio, y, note, va="center", fontsize=7)
            ax.set_xscale("log")
            ax.set_yticks(range(len(rs)), [r["peer"] for r in rs])
            ax.set_ylim(len(rs) - 0.5, -0.5)
            ax.axvline(1.0, color=OTHER_COLOUR, lw=0.8)
            ax.set_title(group, fontsize=8, loc="left")
        axes[-1, 0].set_xlabel("modeled time / ideal (log)")
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
        plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]
