"""What every command shares: the one-line usage error, argument helpers and types, JSON and table output. Light:
the parser imports it for `--help`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from packaging.version import InvalidVersion, Version

from ..decide.system import BACKENDS
from ..errors import KernelHubError, VersionSpecError
from ..package.buildfmt import FRAMEWORKS
from ..tpu.chips import parse_generations
from ..ui.display import clean

if TYPE_CHECKING:
    from ..json_types import JsonValue

DEBUG_ENV = "KERNEL_HUB_DEBUG"


TRUST_FLAG = "--trust-remote-code"
TRUST_LIST_FLAG = "--trust"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), and `--trust-remote-code=LIST` is read as
    `--trust LIST` (the bare flag is a switch that never takes the next word, so it cannot swallow a repo id)."""
    commands: tuple[str, ...] = ()
    trust_flag_seen = False

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        words = list(sys.argv[1:] if args is None else args)
        if TRUST_FLAG in self._option_string_actions:
            words = split_trust_values(words)
        self.trust_flag_seen = any(w == TRUST_FLAG or w.startswith(f"{TRUST_FLAG}=") for w in words)
        return super().parse_known_args(words, namespace)

    def error(self, message: str) -> NoReturn:
        hint = ""
        if message.startswith("unrecognized arguments") and self.trust_flag_seen:
            hint = (f"; {TRUST_FLAG} takes no value: name repos/orgs as {TRUST_FLAG}=ORG,ORG/NAME or "
                    f"{TRUST_LIST_FLAG} ORG")
        print(f"{self.prog}: error: {message}{hint} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def split_trust_values(words: list[str]) -> list[str]:
    """`--trust-remote-code=a,b` -> `--trust a,b`; words after `--` are left alone."""
    out: list[str] = []
    for i, word in enumerate(words):
        if word == "--":
            return out + words[i:]
        if word.startswith(f"{TRUST_FLAG}="):
            out += [TRUST_LIST_FLAG, word.split("=", 1)[1]]
        else:
            out.append(word)
    return out


def version_spec(value: str | None) -> int | str | None:
    """--version as get_kernel takes it: ASCII digits are a major version (an int), anything else a spec string."""
    if value is None or not (value.isascii() and value.isdigit()):
        return value
    if len(value) > 7:
        raise VersionSpecError(f"--version {value[:12]}...: a major version of {len(value)} digits is not one")
    return int(value)


def trust_setting(value: bool | list[str] | None) -> bool | list[str]:
    """The parsed trust flags: neither -> False, bare --trust-remote-code -> True (every repo), --trust /
    --trust-remote-code=LIST -> those repos/orgs."""
    if value is None or isinstance(value, bool):
        return bool(value)
    return list(value)


def print_json(data: JsonValue) -> None:
    print(json.dumps(data, indent=2))


def add_json_arg(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON (keys: docs/cli-json.md)")


def version_of(what: str, value: str | None) -> str | None:
    if value is None:
        return None

    try:
        return str(Version(value))
    except InvalidVersion:
        raise KernelHubError(f"{what} {value!r} is not a version like 0.10.2") from None


def add_version_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--version", dest="spec", help="int major (1) or PEP 440 spec ('>=1.0,<2'); default: registry")
    p.add_argument("--revision", help="any branch, tag or commit (instead of --version)")
    add_target_args(p)


def add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=BACKENDS, help="override the detected backend")
    p.add_argument("--framework", choices=FRAMEWORKS, default="jax", help="tensors the build takes")


class _TrustAll(argparse.Action):
    """Bare --trust-remote-code: trust every repo (wins over any list)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[str] | None, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, True)


class _TrustSome(argparse.Action):
    """--trust ORG[,ORG/NAME...] (repeatable): trust those repos and organisations."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[str] | None, option_string: str | None = None) -> None:
        current = getattr(namespace, self.dest, None)
        if current is True:
            return
        named = [v.strip() for v in str(values).split(",")]
        if not all(named):
            raise argparse.ArgumentError(self, f"expected ORG or ORG/NAME separated by commas, got {values!r}")
        setattr(namespace, self.dest, [*(current or []), *named])


def add_trust_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(TRUST_FLAG, dest="trust_remote_code", action=_TrustAll, default=None,
                   help="run code from any repo, also outside the trusted organisations (a switch: it takes no "
                        f"value; to trust only some, {TRUST_FLAG}=ORG,ORG/NAME or {TRUST_LIST_FLAG})")
    p.add_argument(TRUST_LIST_FLAG, dest="trust_remote_code", action=_TrustSome, metavar="ORG[,ORG/NAME...]",
                   help="also run code from these organisations (ORG) and repos (ORG/NAME) beside the trusted "
                        "organisations; repeatable, commas allowed")


def table(rows: Sequence[Sequence[str]]) -> str:
    rows = [[clean(v) for v in r] for r in rows]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def tpu_generations(text: str) -> tuple[str, ...]:
    try:
        return parse_generations(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def byte_size(text: str) -> int:
    """A byte count for argparse: 1048576, 512K, 512M, 2G (binary units)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    value = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = units.get(value[-1:], 1)
    try:
        size = int(value[:-1] if scale > 1 else value) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or with K/M/G)") from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return size


def seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"not a number of seconds in (0, 3600]: {text!r}")
    return value


def simulated_backend(backend: str | None, tpu_generation: str | None) -> tuple[str | None, str]:
    """resolve's backend: --tpu-generation alone implies --backend tpu (and says so); with another backend it is a
    contradiction, refused in one line."""
    if tpu_generation is None:
        return backend, ""
    if backend is None:
        return "tpu", f"--tpu-generation {tpu_generation} implies --backend tpu"
    if backend != "tpu":
        raise KernelHubError(f"--tpu-generation {tpu_generation} simulates a TPU, but --backend is {backend}: "
                             "drop one of them")
    return backend, ""
