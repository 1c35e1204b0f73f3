"""No import cycle anywhere: not in src/kernel_hub, not in the checkout's cost model (src/tpu_cost_model), not in
any kernel package under kernels/pallas/, not in kernels/pallas/_common, not among the bench/ scripts. Imports inside
functions count (an import hidden in a function to dodge a cycle is still a cycle), and so does
`importlib.import_module` of a name known statically (a literal, `__package__`, `__name__`), or a TPU worker's mode
table entry (`WorkerMode(module, name)`). Each kernel package and _common are their own module trees; a kernel's
`._vendor.x` is _common's `x` (kernel-hub vendors _common into the package). Static (ast): nothing is imported."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = SRC / "kernel_hub"
COST_MODEL = SRC / "tpu_cost_model"
PALLAS = ROOT / "kernels" / "pallas"
BENCH = ROOT / "bench"
COMMON = "_common"
VENDOR = "_vendor"


def _trees() -> list[Path]:
    """Every module tree the graph covers: kernel_hub, the cost model, _common, and each kernel's package
    (kernel.yaml python_name)."""
    kernels = sorted(k / yaml.safe_load((k / "kernel.yaml").read_text())["python_name"]
                     for k in PALLAS.iterdir() if (k / "kernel.yaml").is_file())
    return [PACKAGE, COST_MODEL, PALLAS / COMMON, *kernels]


def _modules(trees: list[Path]) -> dict[str, Path]:
    """Dotted module name -> file, each tree named from its own folder (a package's name for its __init__)."""
    out = {}
    for tree in trees:
        for path in tree.rglob("*.py"):
            parts = list(path.relative_to(tree.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


@dataclass
class Graph:
    """Edges between the covered modules: `top` counts module-level imports only, `every` imports inside
    functions too; `in_functions` lists the import statements inside functions that reach a covered module."""

    modules: dict[str, Path]
    top: dict[str, set[str]] = field(default_factory=dict)
    every: dict[str, set[str]] = field(default_factory=dict)
    in_functions: list[str] = field(default_factory=list)


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _absolute(name: str, path: Path, module: str, level: int) -> str:
    """`from <level dots><module> import` in module `name`, as an absolute name."""
    if not level:
        return module
    here = _package_of(name, path).split(".")
    here = here[: len(here) - (level - 1)]
    return ".".join([*here, *([module] if module else [])])


def _unvendored(target: str) -> str:
    """`<kernel>._vendor.x` is `_common.x`: the file kernel-hub copies into the package."""
    parts = target.split(".")
    return ".".join([COMMON, *parts[2:]]) if len(parts) >= 2 and parts[1] == VENDOR else target


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The covered module a dotted name loads: an attribute's name walks up to its module; None outside the
    covered trees."""
    target = _unvendored(target)
    while target not in modules and "." in target:
        target = target.rsplit(".", 1)[0]
    return target if target in modules else None


def _import_names(name: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = _absolute(name, path, node.module or "", node.level)
    return [f"{base}.{a.name}" if _unvendored(f"{base}.{a.name}") in modules else base for a in node.names]


def _static_string(node: ast.expr, name: str, path: Path) -> str | None:
    """A string known without running the module: a literal, `__name__`, `__package__`, or an f-string of those."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in ("__name__", "__package__"):
        return name if node.id == "__name__" else _package_of(name, path)
    if isinstance(node, ast.JoinedStr):
        pieces = [_static_string(v.value if isinstance(v, ast.FormattedValue) else v, name, path)
                  for v in node.values]
        return None if None in pieces else "".join(p for p in pieces if p is not None)
    return None


def _import_module_name(name: str, path: Path, node: ast.Call) -> str | None:
    """The absolute module name of an `importlib.import_module(...)` / `import_module(...)` call, of a layer kind's
    `deferred(module, name)` (its flow, imported on first call), or of a TPU worker's `WorkerMode(module, name)` (a
    mode's function, imported when a request asks for it), when static."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in ("import_module", "deferred", "WorkerMode") or not node.args:
        return None
    wanted = _static_string(node.args[0], name, path)
    if wanted is None or not wanted.startswith("."):
        return wanted
    anchor = _static_string(node.args[1], name, path) if len(node.args) > 1 else None
    if anchor is None:
        return None
    dots = len(wanted) - len(wanted.lstrip("."))
    base = anchor.split(".")[: len(anchor.split(".")) - (dots - 1)]
    return ".".join([*base, *([wanted[dots:]] if wanted[dots:] else [])])


def _script_modules(folder: Path) -> dict[str, Path]:
    """A folder of scripts run as `python folder/x.py`: the folder is first on sys.path, so each file is the top-level
    module named by its stem (`from moe_common import ...`)."""
    return {path.stem: path for path in sorted(folder.glob("*.py"))}


def build_graph(trees: list[Path], modules: dict[str, Path] | None = None) -> Graph:
    """Parse every module of the trees (or the `modules` given, by name) and record which covered modules each one
    imports."""
    modules = _modules(trees) if modules is None else modules
    graph = Graph(modules, {m: set() for m in modules}, {m: set() for m in modules})

    def add(name: str, wanted: list[str], in_function: bool, where: str) -> None:
        found = {t for t in (_resolve(w, modules) for w in wanted) if t is not None and t != name}
        graph.every[name] |= found
        if in_function and found:
            graph.in_functions.append(where)
        if not in_function:
            graph.top[name] |= found

    def walk(name: str, path: Path, node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{getattr(child, 'lineno', 0)}"
            if isinstance(child, ast.Import | ast.ImportFrom):
                add(name, _import_names(name, path, child, modules), in_function, where)
            elif isinstance(child, ast.Call) and (dynamic := _import_module_name(name, path, child)):
                add(name, [dynamic], in_function, where)
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            walk(name, path, child, inner)

    for name, path in modules.items():
        walk(name, path, ast.parse(path.read_text()), False)
    return graph


@functools.cache
def _graph() -> Graph:
    return build_graph(_trees())


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_cycle_anywhere() -> None:
    """One loop of modules anywhere (imports inside functions included) fails; the counts are printed (-s)."""
    graph = _graph()
    cycles = _cycles(graph.every)
    print(f"\nimport graph: {len(graph.modules)} modules, {sum(map(len, graph.every.values()))} edges, "
          f"{len(graph.in_functions)} imports inside functions, {len(cycles)} cycles")
    for cycle in cycles:
        print("  cycle:", " <-> ".join(cycle))
    assert cycles == [], f"import cycles (imports inside functions included): {cycles}"


def test_no_cycle_among_the_bench_scripts() -> None:
    """The bench scripts import each other by bare name (what two share lives in a module both import, e.g.
    moe_common.py); no loop among them, imports inside functions included."""
    graph = build_graph([], _script_modules(BENCH))
    assert {"moe_decode", "moe_quantized", "moe_common"} <= set(graph.modules)
    assert {"moe_common", "moe_quantized"} <= graph.every["moe_decode"]  # the edges are seen
    assert _cycles(graph.every) == [], _cycles(graph.every)


def test_no_cycle_among_module_level_imports() -> None:
    assert _cycles(_graph().top) == []


def test_the_graph_covers_every_tree() -> None:
    """kernel_hub, _common and every kernel package are in the graph, and a kernel's `_vendor` imports land on
    _common (ragged_dot's dispatch uses _common's)."""
    graph = _graph()
    roots = {m.split(".")[0] for m in graph.modules}
    assert {"kernel_hub", "tpu_cost_model", COMMON, "ragged_dot", "flash_attention", "rms_norm"} <= roots
    assert "_common.dispatch" in graph.every["ragged_dot.dispatch"]


@pytest.mark.parametrize(("folder", "forbidden"), [("verify.validation", "tpu"), ("package.buildfmt", "tpu")])
def test_numbers_and_the_build_format_need_no_tpu(folder: str, forbidden: str) -> None:
    name = "kernel_hub." + folder.removesuffix(".py")
    assert not {t for t in _graph().every[name] if t.startswith(f"kernel_hub.{forbidden}")}


def test_the_tpu_sides_stay_apart() -> None:
    """The compile gate (tpu/compile_gate) and the cost model (tpu_cost_model) never import each other; what they
    share lives once in tpu/ and imports neither, but for worker.py, whose mode table names the compile gate's."""
    every = _graph().every
    sides = ("kernel_hub.tpu.compile_gate", "tpu_cost_model")
    for side, other in (sides, sides[::-1]):
        assert not {(m, t) for m, ts in every.items() if m.startswith(side) for t in ts if t.startswith(other)}
    shared = [m for m in every if m.startswith("kernel_hub.tpu") and not m.startswith(sides)]
    assert {m for m in shared for t in every[m] if t.startswith(sides)} == {"kernel_hub.tpu.worker"}
    assert "kernel_hub.tpu.compile_gate.compile_worker" in every["kernel_hub.tpu.worker"]


def test_the_cost_model_sits_on_kernel_hub_and_never_under_it() -> None:
    """tpu_cost_model imports kernel_hub (its TPU environment, runner, worker table); nothing in kernel_hub imports
    it (imports inside functions and mode tables included), so the client wheel works without it."""
    every = _graph().every
    assert [f"{m} -> {t}" for m, ts in every.items() if m.startswith("kernel_hub") for t in ts
            if t.split(".")[0] == "tpu_cost_model"] == []
    assert "kernel_hub.tpu.worker" in every["tpu_cost_model.worker"]
    assert {f"tpu_cost_model.{m}" for m in ("model_worker", "model_quant", "calibration_worker", "peers_worker",
                                             "mesh_worker")} <= every["tpu_cost_model.worker"]


def test_the_guard_sees_a_cycle() -> None:
    """The cycle finder itself: a two-module loop is found, a chain is not."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_detector_sees_a_cycle_hidden_in_functions(tmp_path: Path) -> None:
    """A synthetic two-module package on disk: a loop closed by an import inside a function, and one closed by
    `importlib.import_module` of a literal, are both cycles of the whole graph and not of the module-level one."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import thing\n")
    (package / "b.py").write_text("thing = 1\n\ndef late():\n    from . import a\n    return a\n")
    (package / "c.py").write_text("from . import a\n")
    (package / "d.py").write_text("import importlib\n\ndef late():\n    return importlib.import_module('pkg.c')\n")
    graph = build_graph([package])
    assert _cycles(graph.every) == [["pkg.a", "pkg.b"]]
    assert _cycles(graph.top) == []
    assert graph.every["pkg.d"] == {"pkg.c"}
    assert len(graph.in_functions) == 2
    (package / "c.py").write_text("from . import a, d\n")
    assert _cycles(build_graph([package]).every) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
    # a kind's declaration naming its flow with deferred(): an edge, and the flow importing the declaration back a cycle
    (package / "kind.py").write_text('KIND = deferred(f"{__package__}.flow", "apply")\n')
    (package / "flow.py").write_text("from .kind import KIND\n")
    assert ["pkg.flow", "pkg.kind"] in _cycles(build_graph([package]).every)
    # a TPU worker's mode table: each WorkerMode entry is an edge to the module it names
    (package / "modes.py").write_text('MODES = {"x": WorkerMode("pkg.flow", "run")}\n')
    assert build_graph([package]).every["pkg.modes"] == {"pkg.flow"}


def test_only_the_hub_client_touches_its_internals() -> None:
    """publish and the CLI reach the Hub through HubClient's public methods: no `x._call(...)` outside its module."""
    client = PACKAGE / "sources" / "hub" / "client.py"
    assert any(isinstance(node, ast.FunctionDef) and node.name == "_call" for node in ast.walk(ast.parse(
        client.read_text()))), "the client module defines the wrapper this test guards"
    found = [f"{path.relative_to(SRC)}:{node.lineno}" for path in PACKAGE.rglob("*.py") if path != client
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "_call"]
    assert found == []


def test_no_cycle_inside_layers() -> None:
    """layers/ is built in layers (kinds on top of the adapters and the jobs: find, plan, load, validate, swap,
    report): no cycle among its modules, counting imports inside functions too."""
    graph = _graph()
    inside = {m: {t for t in targets if t.startswith("kernel_hub.layers")}
              for m, targets in graph.every.items() if m.startswith("kernel_hub.layers")}
    assert _cycles(inside) == [], "import cycles inside layers/ (imports inside functions included)"


#: src/kernel_hub's folders from the ground up: a folder imports only folders on a lower floor (never sideways or
#: up); `kernel_hub` itself (its __init__) is the public surface the demo, the dashboard and the CLI build on.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "json_types"),
    ("names", "lazy", "files"),
    ("decide", "ui"),
    ("package",),
    ("sources", "verify"),
    ("load",),
    ("tpu",),
    ("api", "publish"),
    ("layers", "scaffold", "server"),
    ("__init__",),
    ("demo", "report"),
    ("cli",),
)


def _floor_group(module: str) -> str | None:
    parts = module.split(".")
    return None if parts[0] != "kernel_hub" else parts[1] if len(parts) > 1 else "__init__"


def test_the_floors_stack() -> None:
    """Every top-level entry of src/kernel_hub sits on one floor, and no import (inside functions included) reaches a
    folder on the same floor or above."""
    floor = {group: level for level, groups in enumerate(FLOORS) for group in groups}
    entries = {p.stem if p.suffix == ".py" else p.name for p in PACKAGE.iterdir()
               if (p.suffix == ".py" or (p / "__init__.py").is_file())}
    assert entries == set(floor), f"on no floor: {entries - set(floor)}; gone: {set(floor) - entries}"
    wrong = sorted(f"{m} -> {t}" for m, targets in _graph().every.items() if (a := _floor_group(m))
                   for t in targets if (b := _floor_group(t)) and a != b and floor[b] >= floor[a])
    assert wrong == []
