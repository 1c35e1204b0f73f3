"""index.html: one static page (no script, no server, plots inlined as SVG) from a Report.

Every value that came from a kernel, a model or an error message is escaped. Cells carry data-* attributes
(kernel, column, dtype, passed, total) so a browser test can read the matrices back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

from ..layers.kinds import BUILTIN_KINDS, LayerKind
from ..verify.timing import format_ratio
from .plots import bench_svg, peers_svg, slug
from .schema import Bench, Cell, Compile, FamilyRow, Report

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1280px;
       padding: 24px; color: #212529; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 32px 0 8px; border-bottom: 1px solid #dee2e6; }
h3 { font-size: 15px; margin: 20px 0 6px; }
.sub { color: #6c757d; }
#headline { display: flex; gap: 28px; align-items: center; background: #f8f9fa; border: 1px solid #dee2e6;
            border-radius: 8px; padding: 16px 20px; margin: 16px 0; }
#pass-rate { font-size: 44px; font-weight: 700; }
#headline.ok #pass-rate { color: #2b8a3e; } #headline.bad #pass-rate { color: #c92a2a; }
table { border-collapse: collapse; margin: 6px 0 12px; }
th, td { border: 1px solid #dee2e6; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f1f3f5; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.cell { text-align: center; font-variant-numeric: tabular-nums; min-width: 34px; }
th.kernel, #compile-matrix th { white-space: nowrap; }
th[colspan] { text-align: center; }
.pass { background: #d3f9d8; } .fail { background: #ffc9c9; } .part { background: #fff3bf; }
.none { background: #f8f9fa; color: #adb5bd; } .skip { background: #f1f3f5; color: #868e96; }
.reasons { font-size: 12px; color: #495057; min-width: 320px; max-width: 560px; }
figure { margin: 8px 0 4px; } figure svg { max-width: 100%; height: auto; }
code { font-size: 12px; }
"""


SHORT_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def _e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def _num(value: float | None, fmt: str = ".2e") -> str:
    return "-" if value is None else format(value, fmt)


def _table(head: Sequence[str] | None, rows: Iterable[Sequence[str]], *, raw: bool = False,
           id_: str | None = None) -> str:
    """A table (head None: none); cells are escaped unless raw (then they are already HTML)."""
    ident = f' id="{_e(id_)}"' if id_ else ""
    thead = "<thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead>" if head else ""
    out = [f"<table{ident}>{thead}<tbody>"]
    for row in rows:
        out.append("<tr>" + "".join(c if raw else f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _cell(cell: Cell | None, *, kernel: str, column: str, dtype: str | None) -> str:
    attrs = f'data-kernel="{_e(kernel)}" data-column="{_e(column)}" data-dtype="{_e(dtype or "")}"'
    if cell is None:
        return f'<td class="cell none" {attrs}>-</td>'
    cls = "pass" if cell.passed == cell.total else "fail" if cell.passed == 0 else "part"
    title = f' title="failed: {_e(", ".join(cell.failed))}"' if cell.failed else ""
    return (f'<td class="cell {cls}" {attrs} data-passed="{cell.passed}" data-total="{cell.total}"{title}>'
            f"{cell.passed}/{cell.total}</td>")


def _td(text: object, cls: str = "") -> str:
    return f'<td class="{cls}">{_e(text)}</td>' if cls else f"<td>{_e(text)}</td>"


def headline(report: Report) -> str:
    h = report.headline
    cls = "ok" if h.passed == h.total else "bad"
    return (f'<section id="headline" class="{cls}"><div id="pass-rate">{100 * h.rate:.1f}%</div>'
            f'<div><div id="headline-text"><strong>{_e(h.text)}</strong></div>'
            f'<div class="sub">{_e(h.validation)}</div><div class="sub">{_e(h.compile)}</div>'
            f'<div class="sub">{_e(h.families)}</div></div></section>')


def environment_table(report: Report) -> str:
    env = report.environment
    versions = ", ".join(f"{k} {v}" for k, v in env.versions.items() if v)
    commit = (env.commit or "not a git checkout") + (" (with local changes)" if env.dirty else "")
    rows = [("date", env.date), ("commit", commit), ("CPU", f"{env.cpu_model or '?'}, {env.cpu_cores} cores "
            f"({env.usable_cores} usable), {env.machine}"), ("Python", f"{env.python} on {env.platform}"),
            ("versions", versions), ("seed", f"{env.seed} (case i of a kernel uses seed + i; kernel-hub report "
            f"--seed {env.seed} repeats it)"),
            ("run", f"{'quick' if report.quick else 'full'} report in {report.seconds:.0f} s")]
    return _table(None, ((f"<th>{_e(k)}</th>", f"<td>{_e(v)}</td>") for k, v in rows), raw=True,
                  id_="environment")


def validation_section(report: Report) -> str:
    v = report.validation
    modes = list(dict.fromkeys(c.column for c in v.matrix))
    dtypes = list(dict.fromkeys(c.dtype for c in v.matrix))
    kernels = list(dict.fromkeys(c.kernel for c in v.matrix))
    by_key = {(c.kernel, c.column, c.dtype): c for c in v.matrix}
    head = ('<tr><th rowspan=2>kernel</th>' + "".join(f"<th colspan={len(dtypes)}>{_e(m)}</th>" for m in modes)
            + "</tr><tr>" + "".join(f"<th class=sub>{_e(SHORT_DTYPES.get(d or '', d))}</th>"
                                    for _ in modes for d in dtypes) + "</tr>")
    body = []
    for k in kernels:
        cells = "".join(_cell(by_key.get((k, m, d)), kernel=k, column=m, dtype=d) for m in modes for d in dtypes)
        body.append(f"<tr><th class=kernel>{_e(k)}</th>{cells}</tr>")
    matrix = f'<table id="validation-matrix"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'
    runs = _table(("kernel", "framework", "version", "variant", "backend", "passed", "seconds", "note"), (
        (r.kernel, r.framework, r.version or "-", r.variant or "-", r.backend or "-",
         f"{r.passed}/{r.total}" if r.total else "-", f"{r.seconds:.1f}", r.skipped or "")
        for r in v.runs), id_="kernel-runs")
    failed = [c for c in v.cases if not c.passed]
    fails = (_table(("kernel", "mode", "case", "dtype", "max error", "error"),
                    ((c.kernel, c.mode, c.name, c.dtype, _num(c.max_error), c.error or "over tolerance")
                     for c in failed), id_="failed-cases") if failed else "<p>No case failed.</p>")
    slowest = sorted(v.cases, key=lambda c: -(c.first_call_seconds or 0))[:10]
    timing = _table(("kernel", "mode", "case", "first call s (compile + run)", "warm median s", "warm runs"), (
        (c.kernel, c.mode, c.name, _num(c.first_call_seconds, ".3f"), _num(c.run_seconds, ".4f"), str(c.warm_runs))
        for c in slowest), id_="slowest-cases")
    return (f'<h2 id="validation">Validation: kernel x mode x dtype</h2><p class=sub>Each kernel\'s own cases '
            f"against its float64 reference on fresh random inputs (seed {v.seed}); a cell is cases passed / run. "
            "Modes: the CPU paths, the Pallas kernels interpreted, the TPU simulator with race detection "
            f"(tpu-interpret), the torch-facing entry (torch).</p>{matrix}<h3>Kernels loaded</h3>{runs}"
            f"<h3>Failed cases</h3>{fails}<h3>Slowest cases (first call vs warm)</h3>{timing}")


def compile_section(c: Compile) -> str:
    title = '<h2 id="tpu-compile">TPU compile: kernel x generation</h2>'
    if not c.available:
        return f'{title}<p id="tpu-compile-missing">Not run: {_e(c.reason)}</p>'
    kernels = list(dict.fromkeys(x.kernel for x in c.matrix))
    by_key = {(x.kernel, x.column): x for x in c.matrix}
    head = "<tr><th>kernel</th>" + "".join(f"<th>{_e(g)}</th>" for g in c.generations) + "</tr>"
    body = "".join(f"<tr><th>{_e(k)}</th>" + "".join(_cell(by_key.get((k, g)), kernel=k, column=g, dtype=None)
                                                    for g in c.generations) + "</tr>" for k in kernels)
    failed = [x for x in c.cases if not x.passed]
    fails = (_table(("kernel", "generation", "case", "compiler said"), (
        (x.kernel, x.generation or "", x.name, x.error or "") for x in failed), id_="compile-failures")
        if failed else "")
    which = ("each kernel's smoke cases (its first forward and backward validation case; kernel-hub report "
             "--tpu-cases all compiles every one)" if c.selection == "smoke" else "every TPU case of each kernel")
    return (f"{title}<p class=sub>{which}, lowered for a mock TPU of that generation and compiled by the real TPU "
            f"compiler (jax {_e(c.jax)}, libtpu {_e(c.libtpu)}), Mosaic included; a cell is cases compiled / "
            f'cases.</p><table id="compile-matrix"><thead>{head}</thead><tbody>{body}</tbody></table>{fails}')


def family_kinds(rows: Sequence[FamilyRow], kinds: Sequence[LayerKind] = BUILTIN_KINDS) -> list[str]:
    """The layer kinds the table shows: the declared `kinds`, then any other kind a row reports (read off the rows;
    the declarations import no model code)."""
    declared = [k.name for k in kinds]
    seen = [k for r in rows for k in (*r.replaced, *r.kept)]
    return [*declared, *dict.fromkeys(k for k in seen if k not in declared)]


def _family_row(r: FamilyRow, kinds: Sequence[str]) -> str:
    cls = {"replaced": "pass", "partial": "part", "kept": "fail", "error": "fail", "skipped": "skip"}[r.status]
    counts = "".join(_td(f"{r.replaced.get(k, 0)} / {r.kept.get(k, 0)}", "num") for k in kinds)
    restored = "-" if r.restored is None else ("yes" if r.restored else "NO")
    return (f'<tr data-family="{_e(r.family)}" data-status="{_e(r.status)}"><th>{_e(r.family)}</th>'
            f"{_td(r.library)}{_td(r.kind)}<td class=\"cell {cls}\">{_e(r.status)}</td>{counts}"
            f'{_td(_num(r.max_layer_error), "num")}{_td(_num(r.output_error), "num")}{_td(restored)}'
            f'<td class="reasons">{"<br>".join(_e(x) for x in r.reasons)}</td></tr>')


def families_section(rows: list[FamilyRow], kinds: Sequence[LayerKind] = BUILTIN_KINDS) -> str:
    """The family table: one "<title> replaced / kept" column per kind (each kind's declared title; a kind only a row
    reports shows its own name)."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    titles = {k.name: k.title for k in kinds}
    columns = family_kinds(rows, kinds)
    head = ("family", "library", "kind", "status", *(f"{titles.get(k, k)} replaced / kept" for k in columns),
            "max layer error", "output error", "restored", "kept because")
    body = "".join(_family_row(r, columns) for r in rows)
    return (f'<h2 id="families">kernelize: model families</h2><p class=sub>A tiny model of each family (random '
            "weights, built from its config), kernelized with the registry's kernels: each layer validated on its "
            "own shapes before the swap, the output compared with the default, restore() checked bit-identical. "
            f"{_e(summary)}.</p><table id=\"family-matrix\"><thead><tr>"
            + "".join(f"<th>{_e(h)}</th>" for h in head) + f"</tr></thead><tbody>{body}</tbody></table>")


def _bench_block(b: Bench) -> str:
    title = f'<h3 id="bench-{_e(slug(b.name))}">{_e(b.name)} <span class=sub>({_e(b.script)}, {b.seconds:.0f} s)' \
            "</span></h3>"
    if not b.ok:
        return f'{title}<p class="bench-error">Did not run: {_e(b.error)}</p>'
    parts = [title]
    svg = bench_svg(b)
    if svg:
        parts.append(f'<figure class="bench-plot" data-bench="{_e(b.name)}">{svg}</figure>')
        parts.append(_table(("group", "method", "median ms", "IQR ms", "min-max ms", "n", f"x vs {b.baseline}"), (
            (r.group, r.method + (" (ours)" if r.ours else ""), f"{r.median_ms:.3f}", f"{r.q1_ms:.3f}-{r.q3_ms:.3f}",
             f"{r.min_ms:.3f}-{r.max_ms:.3f}", str(r.n), format_ratio(r.vs_baseline)) for r in b.records)))
    peers = peers_svg(b)
    if peers:
        parts.append(f'<figure class="bench-plot" data-bench="{_e(b.name)}">{peers}</figure>')
    if b.rows:
        keys = [k for k in b.rows[0] if not isinstance(b.rows[0][k], list | dict)]
        parts.append(_table(keys, ([_fmt(row.get(k)) for k in keys] for row in b.rows)))
    return "".join(parts)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def benches_section(benches: list[Bench]) -> str:
    if not benches:
        return ""
    return ('<h2 id="benches">Benchmarks</h2><p class=sub>Medians of interleaved runs (order rotated each round) '
            "with the interquartile range; a ratio is the median of the per-round ratios to the baseline with "
            "their quartiles (&gt;1: faster than the baseline).</p>" + "".join(_bench_block(b) for b in benches))


def render(report: Report) -> str:
    env = report.environment
    commit = (env.commit or "?")[:12]
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        f"<title>kernel-hub report {_e(env.date)}</title><style>{CSS}</style></head><body>"
        f"<h1>kernel-hub validation report</h1><div class=sub>{_e(env.date)}, commit {_e(commit)}, "
        f"{_e(env.cpu_model or env.machine)}</div>"
        f"{headline(report)}{environment_table(report)}{validation_section(report)}"
        f"{compile_section(report.compile)}{families_section(report.families)}{benches_section(report.benches)}"
        "</body></html>\n"
    )
