"""The documentation names what the code has: docs/environment.md's table every variable kernel-hub and its kernels
read (a variable added in the code and not in the table fails here: a user cannot set what they cannot find), every
file README.md and docs/*.md name exists, and docs/layout.md names every top-level module."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENVIRONMENT = ROOT / "docs" / "environment.md"
LAYOUT = ROOT / "docs" / "layout.md"
#: read by the code only to pass on unchanged (the compiler's PATH) or set by kernel-hub for its own subprocesses
NOT_SETTINGS = {"PATH"}
OWN = re.compile(r"KERNEL_HUB_[A-Z0-9_]*[A-Z0-9]")


def _string_constants(tree: ast.AST) -> dict[str, str]:
    """NAME = "VALUE" module constants (the code names its variables once, e.g. CACHE_ENV = "KERNEL_HUB_CACHE")."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
    return out


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (isinstance(node, ast.Name)
                                                                             and node.id == "environ")


def variables_read(path: Path) -> set[str]:
    """Every variable name `path` reads through os.environ.get / os.environ[...] / os.getenv, literal or constant,
    and every string that is a name in kernel-hub's own namespace (KERNEL_HUB_*: read through helpers too)."""
    tree = ast.parse(path.read_text())
    consts = _string_constants(tree)
    names = set()
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            environ_get = isinstance(f, ast.Attribute) and f.attr == "get" and _is_environ(f.value)
            if environ_get or (isinstance(f, ast.Attribute) and f.attr == "getenv"):
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            arg = node.slice
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and OWN.fullmatch(node.value):
            names.add(node.value)
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            names.add(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in consts:
            names.add(consts[arg.id])
    return names


def documented_variables(text: str) -> set[str]:
    """The names in the first column of the environment-variable table (rows that start with a backquoted name)."""
    section = text[text.index("## Environment variables"):]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split("|")[1])}


def test_the_table_reader_reads_only_the_first_column():
    text = ("## Environment variables\n\n| variable | what |\n|---|---|\n| `KH_A`, `KH_B` | sets `KH_C` |\n"
            "\n## Next\n\n| `KH_D` | elsewhere |\n")
    assert documented_variables(text) == {"KH_A", "KH_B"}


def test_the_reader_finds_literals_and_constants(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('import os\nX_ENV = "KH_A"\nos.environ.get(X_ENV)\nos.environ["KH_B"]\nos.getenv("KH_C", "1")\n'
                   'os.environ["KH_SET"] = "1"\n'
                   'def f(name=\"KERNEL_HUB_VIA_HELPER\"): return name\n')
    assert variables_read(src) == {"KH_A", "KH_B", "KH_C", "KERNEL_HUB_VIA_HELPER"}


def test_docs_list_every_variable_the_code_reads():
    files = [p for top in ("src/kernel_hub", "kernels/pallas") for p in (ROOT / top).rglob("*.py")
             if "/tests/" not in p.as_posix()]
    read = {name: p.relative_to(ROOT).as_posix() for p in files for name in variables_read(p)}
    table = documented_variables(ENVIRONMENT.read_text())
    missing = {name: where for name, where in read.items() if name not in table and name not in NOT_SETTINGS}
    assert not missing, f"docs/environment.md's environment-variable table lacks: {missing}"
    assert {"CC", "KERNEL_HUB_CACHE", "KERNEL_HUB_CPU_WORKERS"} <= table


#: files the docs name that a run writes, not the checkout: a build's metadata.json, `make report`'s output,
#: `serve-model --report`'s file
WRITTEN_BY_A_RUN = {"metadata.json", "report/report.json", "report.json", "kernelize.json"}


def documentation() -> dict[str, str]:
    """README.md and every docs/*.md, by path."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in pages}


def test_docs_name_only_files_that_exist():
    """Every file README.md and docs/*.md name (`x.py`, `dir/x.py`, `schedule*.py`) is in the checkout: a move
    that leaves the documentation behind fails here."""
    text = "\n".join(documentation().values())
    named = set(re.findall(r"`([A-Za-z0-9_./*-]+\.(?:py|c|h|yaml|md|json|tmpl))`", text)) - WRITTEN_BY_A_RUN
    files = [p.relative_to(ROOT).as_posix() for top in ("src", "kernels", "tests", "bench", "docs", "examples")
             for p in (ROOT / top).rglob("*") if p.is_file()]
    files += [p.name for p in ROOT.iterdir() if p.is_file()]
    files += [f.removesuffix(".tmpl") for f in files if f.endswith(".tmpl")]  # `kernel-hub init` writes them

    def exists(name: str) -> bool:
        pattern = re.compile(r"(^|/)" + re.escape(name).replace(r"\*", "[^/]*") + "$")
        return any(pattern.search(f) for f in files)

    assert len(named) > 50  # the layout page is there and was read
    missing = sorted(n for n in named if not exists(n))
    assert not missing, f"the docs name files that are not in the checkout: {missing}"


def layout_section(text: str) -> str:
    """docs/layout.md's module-by-module section: its list of src/kernel_hub's top-level modules."""
    section = text[text.index("## src/kernel_hub/"):]
    end = section.find("\n## ", 1)
    return section if end < 0 else section[:end]


def test_layout_names_every_top_level_module():
    """Each module and subpackage directly under src/kernel_hub is named in docs/layout.md's module list (a file
    of the same name elsewhere, a kind's `contract.py`, does not count)."""
    layout = layout_section(LAYOUT.read_text())
    top = ROOT / "src" / "kernel_hub"
    names = [p.name for p in top.glob("*.py") if p.name != "__init__.py"]
    names += [p.name + "/" for p in top.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    missing = sorted(n for n in names if f"`{n}`" not in layout)
    assert not missing, f"docs/layout.md does not name: {missing}"
