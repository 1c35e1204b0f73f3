"""The TPU compile record a release carries: which generations its TPU build was compiled for, with which
compiler, how many cases compiled. It lives in each TPU variant's metadata.json (kernel-hub section,
`tpu_compile`), so a TPU user can see before installing that every case of that build compiled for their chip
(HF kernels records nothing of the kind). Read back from a Hub it is untrusted input: a strict schema, one-line
errors. A TPU variant published with --skip-tpu-compile carries status "not compiled" and the reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator

from ..errors import IntegrityError

COMPILED, NOT_COMPILED = "compiled", "not compiled"
_WORD = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
#: A jax / libtpu version (or a generation name) as it may appear in a record or a cache file name.
VERSION_PATTERN = re.compile(r"^[0-9A-Za-z.+_-]{1,64}$")


class GenerationSummary(BaseModel):
    """One generation's row: cases tried, how many compiled, and which implementation compiled how many (a wrapper
    may fall through from Mosaic to XLA). No timings: the record must come out byte-identical whenever the same
    code is compiled by the same jax/libtpu, so a re-publish of unchanged content stays a no-op."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)
    cases: int = Field(ge=0)
    compiled: int = Field(ge=0)
    implementations: dict[StrictStr, int] = Field(default_factory=dict)

    @field_validator("implementations")
    @classmethod
    def _names(cls, value: dict[str, int]) -> dict[str, int]:
        if len(value) > 16 or not all(_WORD.fullmatch(k) and n >= 0 for k, n in value.items()):
            raise ValueError("implementations must map a lowercase name to a count")
        return value


class TpuCompileRecord(BaseModel):
    """A TPU variant's compile matrix as a release records it."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)
    status: Literal["compiled", "not compiled"]
    reason: StrictStr | None = Field(default=None, max_length=300)
    generations: list[StrictStr] = Field(default_factory=list, max_length=16)
    jax: StrictStr | None = None
    libtpu: StrictStr | None = None
    cases: int = Field(default=0, ge=0)
    compiled: int = Field(default=0, ge=0)  # (generation, case) pairs that compiled
    failed: list[StrictStr] = Field(default_factory=list, max_length=4096)
    per_generation: dict[StrictStr, GenerationSummary] = Field(default_factory=dict)

    @field_validator("generations")
    @classmethod
    def _generations(cls, value: list[str]) -> list[str]:
        if not all(_WORD.fullmatch(g) for g in value):
            raise ValueError("generations must be names like 'v5e'")
        return value

    @field_validator("jax", "libtpu")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is not None and not VERSION_PATTERN.fullmatch(value):
            raise ValueError("not a version like 0.10.2")
        return value

    @property
    def passed(self) -> bool:
        return self.status == COMPILED and not self.failed and self.compiled == self.cases * len(self.generations)

    def lines(self) -> list[str]:
        """What `kernel-hub info` prints for this variant."""
        if self.status != COMPILED:
            return [f"not compiled for TPU{f' ({self.reason})' if self.reason else ''}"]
        total = self.cases * len(self.generations)
        head = (f"compiled for TPU {','.join(self.generations)}: {self.compiled}/{total} "
                f"({self.cases} cases x {len(self.generations)} generations) with jax {self.jax}, libtpu {self.libtpu}")
        out = [head]
        for gen, row in self.per_generation.items():
            impls = ", ".join(f"{n} {name}" for name, n in sorted(row.implementations.items()))
            out.append(f"  {gen:<4} {row.compiled}/{row.cases} compiled{f' ({impls})' if impls else ''}")
        out += [f"  failed: {name}" for name in self.failed[:5]]
        return out


def parse_record(data: object, label: str) -> TpuCompileRecord | None:
    """The `tpu_compile` field of a build's metadata.json (None when absent); IntegrityError when malformed."""
    if data is None:
        return None
    try:
        return TpuCompileRecord.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise IntegrityError(f"{label}: metadata.json tpu_compile.{where}: {first['msg']}") from None


def not_compiled(reason: str) -> dict[str, Any]:
    """The record of a TPU variant published without the compile gate."""
    return TpuCompileRecord(status=NOT_COMPILED, reason=reason).model_dump()


class CompiledCase(Protocol):
    """What a record needs of a compile case (verify.results.CompileResult; the other kind has no generation)."""

    @property
    def name(self) -> str: ...
    @property
    def passed(self) -> bool: ...
    @property
    def implementation(self) -> str | None: ...
    @property
    def generation(self) -> str: ...


def record_from_cases(cases: Sequence[CompiledCase], generations: Sequence[str], jax_version: str | None,
                      libtpu_version: str | None) -> dict[str, Any]:
    """The record for `generations` from the compile cases of a gate report (JSON-ready)."""
    mine = [c for c in cases if c.generation in generations]
    per: dict[str, GenerationSummary] = {}
    for gen in generations:
        rows = [c for c in mine if c.generation == gen]
        impls: dict[str, int] = {}
        for c in rows:
            if c.passed and c.implementation:
                impls[c.implementation] = impls.get(c.implementation, 0) + 1
        per[gen] = GenerationSummary(cases=len(rows), compiled=sum(c.passed for c in rows),
                                     implementations=dict(sorted(impls.items())))
    record = TpuCompileRecord(
        status=COMPILED, generations=list(generations), jax=jax_version, libtpu=libtpu_version,
        cases=len({c.name for c in mine}), compiled=sum(c.passed for c in mine),
        failed=sorted(f"{c.generation}:{c.name}" for c in mine if not c.passed), per_generation=per)
    return record.model_dump()
