"""The share of src/kernel_hub's parameters annotated with `Any` stays low: a hand-off between modules names its type
(an array, a jaxpr equation, parsed JSON, a Protocol), so `Any` is left to what really is anything (e.g. **kwargs
forwarded to a third-party API)."""

import ast
from pathlib import Path

import kernel_hub

PACKAGE = Path(kernel_hub.__file__).resolve().parent
#: The highest share allowed, in percent: what the package holds, so the share cannot grow back.
MAX_ANY_SHARE = 4.6


def _names_any(annotation: ast.expr) -> bool:
    """Whether an annotation mentions typing.Any (bare, dotted, or inside a string annotation)."""
    for node in ast.walk(annotation):
        if getattr(node, "id", None) == "Any" or getattr(node, "attr", None) == "Any":  # Any, typing.Any
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                if _names_any(ast.parse(node.value, mode="eval").body):
                    return True
            except SyntaxError:  # a string that is not an annotation
                continue
    return False


def any_parameters(source: str) -> tuple[int, int]:
    """(parameters, those annotated with Any) of every function in `source`; self and cls are not counted."""
    total = with_any = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]:
                if p.arg in ("self", "cls"):
                    continue
                total += 1
                with_any += p.annotation is not None and _names_any(p.annotation)
    return total, with_any


def test_the_counter_sees_every_spelling_of_any():
    source = ("import typing\n"
              "def f(a: Any, b: int, /, c: 'list[Any]', *d: typing.Any, e: AnyStr, **f: object) -> Any: ...\n"
              "class C:\n    def m(self, x: dict[str, Any]) -> None: ...\n")
    assert any_parameters(source) == (7, 4)


def test_any_share_stays_low():
    total = with_any = 0
    for path in PACKAGE.rglob("*.py"):
        if "templates" in path.parts:  # scaffold templates are files written for users, not kernel_hub's code
            continue
        t, a = any_parameters(path.read_text())
        total, with_any = total + t, with_any + a
    share = 100 * with_any / total
    assert total > 1000  # the walk found the package
    assert share <= MAX_ANY_SHARE, (f"{with_any} of {total} parameters ({share:.1f}%) are annotated with Any; "
                                    f"name the type at the hand-off (at most {MAX_ANY_SHARE}%)")
