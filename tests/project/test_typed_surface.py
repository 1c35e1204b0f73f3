"""The public surface as a type checker sees it: `kh.get_kernel` and friends carry their signatures (the package ships
py.typed), and a misspelt public name is an error, not a silent `Any` from the lazy loader's `__getattr__`."""

import subprocess
import sys
from pathlib import Path

import kernel_hub
from tests.client_env import child_env

SRC = Path(kernel_hub.__file__).resolve().parents[1]

USER_SCRIPT = """\
import kernel_hub as kh

reveal_type(kh.get_kernel)
reveal_type(kh.kernelize)
reveal_type(kh.validate)
module = kh.get_kernel("kernel-hub/ragged-dot-tpu", version=1)
kh.get_kernal("kernel-hub/ragged-dot-tpu")
kh.get_kernel("kernel-hub/ragged-dot-tpu", versoin=1)
"""


def _mypy(tmp_path: Path) -> list[str]:
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    env = child_env()
    env["MYPYPATH"] = str(SRC)  # our sources only: fast, no site-packages
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-site-packages", "--follow-imports=silent",
                          "--ignore-missing-imports", "--cache-dir", str(tmp_path / "cache"), "--no-error-summary",
                          "--hide-error-context", str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert "error: Cannot find implementation or library stub" not in out.stdout, out.stdout
    return out.stdout.splitlines()


def test_type_checker_reads_the_lazy_public_names(tmp_path):
    lines = _mypy(tmp_path)
    revealed = [line for line in lines if "Revealed type" in line]
    assert len(revealed) == 3, lines
    get_kernel, kernelize, validate = revealed
    for arg in ("repo_id: str", "version: int | str | None", "revision: str | None", "trust_remote_code:"):
        assert arg in get_kernel, get_kernel
    assert "types.ModuleType" in get_kernel
    assert "def [Model]" in kernelize and kernelize.endswith("-> Model\"") and "mapping:" in kernelize  # same type back
    assert "ValidationReport" in validate
    # the misspelt name and the misspelt keyword are both errors, on their own lines
    assert any(":7: error:" in line and "get_kernal" in line for line in lines), lines
    assert any(":8: error:" in line and "versoin" in line for line in lines), lines
    assert not any(":6: error:" in line for line in lines), lines


def test_the_typed_names_are_exactly_the_lazy_names():
    """The TYPE_CHECKING re-exports and the run-time lazy table list the same names from the same modules."""
    import ast

    tree = ast.parse(Path(kernel_hub.__file__).read_text())
    typed = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                for alias in imp.names:
                    assert alias.asname == alias.name, f"{alias.name} must be re-exported as itself"
                    typed[alias.name] = imp.module
    assert typed == kernel_hub._LAZY
