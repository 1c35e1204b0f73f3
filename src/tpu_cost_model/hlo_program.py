"""The optimized HLO module libtpu compiles (``compiled.as_text()``), read into instructions with shapes and operands.

Only what the cost model charges from is kept: each computation's instructions with their result shape (arrays with
dtype, dimensions and memory space: ``S(1)`` is VMEM, no mark is HBM), opcode, operand names and attributes (raw
text, e.g. ``kind=kLoop``, ``calls=%fused_computation``, ``custom_call_target="tpu_custom_call"``). The text is
read with a small scanner (balanced brackets, quoted strings), one instruction a line as XLA prints them. Pure: no
jax needed, so a checked-in HLO text is parsed on any machine.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

#: Bits per element of each HLO primitive type.
_BITS = {"pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32,
         "u32": 32, "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
         "f8e4m3fn": 8, "f8e5m2": 8, "f8e4m3fnuz": 8, "f8e5m2fnuz": 8, "f8e4m3b11fnuz": 8, "f8e4m3": 8, "f8e3m4": 8,
         "f4e2m1fn": 4, "f8e8m0fnu": 8, "token": 0}
#: HLO type names as numpy names (the MXU pass rule's keys).
NUMPY_NAMES = {"pred": "bool", "bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64", "s4": "int4",
               "s8": "int8", "u8": "uint8", "s16": "int16", "u16": "uint16", "s32": "int32", "u32": "uint32",
               "s64": "int64", "u64": "uint64", "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}
VMEM = 1  # the memory space XLA's TPU backend marks S(1)
#: The printer's position marks inside long lists (``/*index=5*/``): not part of the program.
_COMMENT = re.compile(r"/\*.*?\*/")


class HloParseError(ValueError):
    """The text is not an HLO module as XLA prints it (the message names the line)."""


@dataclass(frozen=True)
class Array:
    """One array of a result: element type, dimensions and the memory space it lives in (0: HBM)."""

    dtype: str
    dims: tuple[int, ...]
    memory_space: int = 0

    @property
    def nbytes(self) -> int:
        return math.prod(self.dims) * _BITS.get(self.dtype, 0) // 8


@dataclass(frozen=True)
class Instruction:
    name: str
    arrays: tuple[Array, ...]  # the result's arrays (a tuple result lists its leaves in order)
    is_tuple: bool
    opcode: str
    operands: tuple[str, ...]
    attrs: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    root: bool = False

    def called(self) -> list[str]:
        """The computations this instruction runs (a fusion's body, a while's condition and body, ...)."""
        out = []
        for key in ("calls", "to_apply", "body", "condition", "true_computation", "false_computation",
                    "branch_computations"):
            raw = self.attrs.get(key)
            if raw:
                out += [n.strip().lstrip("%") for n in raw.strip("{}").split(",") if n.strip()]
        return out


@dataclass
class Computation:
    name: str
    entry: bool
    instructions: list[Instruction] = field(default_factory=list)

    def get(self, name: str) -> Instruction:
        for inst in self.instructions:
            if inst.name == name:
                return inst
        raise KeyError(name)


@dataclass
class Module:
    name: str
    computations: dict[str, Computation]

    @property
    def entry(self) -> Computation:
        for comp in self.computations.values():
            if comp.entry:
                return comp
        raise HloParseError("the module has no ENTRY computation")


class _Scanner:
    """A cursor over one line: names, balanced groups and quoted strings."""

    def __init__(self, text: str):
        self.s, self.i = text, 0

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1

    def peek(self) -> str:
        self.ws()
        return self.s[self.i] if self.i < len(self.s) else ""

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            raise HloParseError(f"expected {ch!r} at column {self.i} of: {self.s[:120]}")
        self.i += 1

    def name(self) -> str:
        self.ws()
        start = self.i
        while self.i < len(self.s) and (self.s[self.i].isalnum() or self.s[self.i] in "%._-$"):
            self.i += 1
        if start == self.i:
            raise HloParseError(f"expected a name at column {self.i} of: {self.s[:120]}")
        return self.s[start:self.i]

    def group(self) -> str:
        """A balanced (), [], {} group or a quoted string, returned with its brackets."""
        self.ws()
        start, depth, closing = self.i, 0, {")": "(", "]": "[", "}": "{"}
        while self.i < len(self.s):
            ch = self.s[self.i]
            if ch == '"':
                self.i = self._string_end(self.i)
                if depth == 0:
                    return self.s[start:self.i]
                continue
            if ch in "([{":
                depth += 1
            elif ch in closing:
                depth -= 1
                if depth == 0:
                    self.i += 1
                    return self.s[start:self.i]
            self.i += 1
        raise HloParseError(f"unbalanced brackets in: {self.s[:120]}")

    def value(self) -> str:
        """An attribute value: a group, a string, or everything up to the next top-level comma."""
        if self.peek() in ("(", "[", "{", '"'):
            return self.group()
        start = self.i
        while self.i < len(self.s) and self.s[self.i] != ",":
            if self.s[self.i] in "([{\"":
                self.group()
                continue
            self.i += 1
        return self.s[start:self.i].strip()

    def _string_end(self, i: int) -> int:
        i += 1
        while i < len(self.s) and self.s[i] != '"':
            i += 2 if self.s[i] == "\\" else 1
        return i + 1


def _shape(sc: _Scanner) -> tuple[tuple[Array, ...], bool]:
    """A result shape: an array like ``bf16[2,8]{1,0:T(8,128)S(1)}`` or a tuple of shapes."""
    if sc.peek() == "(":
        sc.expect("(")
        arrays: list[Array] = []
        while sc.peek() != ")":
            leaves, _ = _shape(sc)
            arrays += leaves
            if sc.peek() == ",":
                sc.expect(",")
        sc.expect(")")
        return tuple(arrays), True
    dtype = sc.name()
    dims: tuple[int, ...] = ()
    if sc.peek() == "[":
        inner = sc.group()[1:-1]
        dims = tuple(int(d.strip().lstrip("<=")) for d in inner.split(",") if d.strip())
    space = 0
    if sc.peek() == "{":
        layout = sc.group()
        mark = layout.find("S(")
        if mark >= 0:
            space = int(layout[mark + 2:layout.index(")", mark)])
    return (Array(dtype, dims, space),), False


def _instruction(line: str) -> Instruction:
    sc = _Scanner(line)
    root = False
    name = sc.name()
    if name == "ROOT":
        root, name = True, sc.name()
    sc.expect("=")
    arrays, is_tuple = _shape(sc)
    opcode = sc.name()
    raw_operands = sc.group()[1:-1]
    operands = []
    for part in _split_top(raw_operands):
        token = part.split()[-1] if part.split() else ""  # "bf16[2] %x" (older printers) or "%x"
        if token.startswith("%"):
            operands.append(token[1:])
    attrs: dict[str, str] = {}
    if opcode in ("constant", "parameter"):  # the value or the parameter's number
        attrs["literal"] = raw_operands.strip()
    while sc.peek() == ",":
        sc.expect(",")
        key = sc.name()
        sc.expect("=")
        attrs[key] = sc.value()
    return Instruction(name.lstrip("%"), arrays, is_tuple, opcode, tuple(operands), attrs, root)


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets and strings."""
    parts, depth, start, quoted = [], 0, 0, False
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "([{":
            depth += 1
        elif not quoted and ch in ")]}":
            depth -= 1
        elif not quoted and ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _open_brackets(line: str) -> bool:
    """Whether a line leaves a (), [] or {} open outside its quoted strings: the instruction goes on below."""
    depth, i = 0, 0
    while i < len(line):
        ch = line[i]
        if ch == '"':
            i = line.find('"', i + 1)
            while i > 0 and line[i - 1] == "\\":
                i = line.find('"', i + 1)
            if i < 0:
                return True
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        i += 1
    return depth > 0


def parse_module(text: str) -> Module:
    """The module's computations and their instructions; raises HloParseError naming the line it cannot read."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("HloModule "):
        raise HloParseError("not an HLO module: the text must start with 'HloModule <name>'")
    module = Module(lines[0].split()[1].rstrip(","), {})
    current: Computation | None = None
    pending, first = "", 0  # an instruction whose brackets a line break left open (a kernel's multi-line metadata)
    for number, line in enumerate(lines[1:], start=2):
        stripped = _COMMENT.sub("", line).strip()
        if pending:
            pending, stripped = "", pending + " " + stripped
        elif current is not None:
            first = number
        if current is not None and stripped and _open_brackets(stripped):
            pending = stripped
            continue
        if current is None:
            if stripped.endswith("{") and "->" in stripped and (stripped.startswith(("%", "ENTRY "))):
                entry = stripped.startswith("ENTRY ")
                header = stripped[len("ENTRY "):] if entry else stripped
                name = header.split()[0].lstrip("%")
                current = module.computations[name] = Computation(name, entry)
            continue
        if stripped == "}" or stripped.startswith("}, execution_thread="):  # the thread a computation runs on
            current = None
        elif stripped:
            try:
                current.instructions.append(_instruction(stripped))
            except (HloParseError, ValueError) as exc:
                raise HloParseError(f"line {first}: {exc}") from None
    if pending:
        raise HloParseError(f"line {first}: unbalanced brackets to the end of the module")
    if current is not None:
        raise HloParseError(f"computation {current.name} is not closed")
    module.entry  # noqa: B018  (raises when there is none)
    return module
