"""Is this release already published with this content? Asked before validating and compiling, so re-publishing
an unchanged kernel costs a listing, not minutes.

The comparison is over the files under build/ (git blob ids), as the final check after upload is. The files that
carry a TPU variant's compile record (its metadata.json, and its bundle, which holds that metadata.json) are left
out: the record is what the gate would write, and the gate is what this check spares; the package inside a TPU
bundle is the same source every other variant ships, which is compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..package import buildfmt as fmt


def record_paths(variants: Iterable[object]) -> frozenset[str]:
    """The build/ files whose bytes depend on the TPU compile record: each TPU variant's metadata.json and
    bundle."""
    out: set[str] = set()
    for v in variants:
        if getattr(v, "backend", None) == "tpu":
            name = v.name  # type: ignore[attr-defined]
            out.add(f"{fmt.BUILD_DIR}/{name}/{fmt.VARIANT_METADATA}")
            out.add(fmt.bundle_path(name))
    return frozenset(out)


def identical_release(local: Mapping[str, str], remote: Mapping[str, str],
                      ignore: frozenset[str] = frozenset()) -> tuple[bool | None, str]:
    """(same, reason): whether two build/ listings (path -> blob id) hold the same files apart from `ignore`;
    None when nothing is left to compare (every build carries a compile record: only the gate can tell). The
    reason names the first path that differs. Pure."""
    mine = {p: b for p, b in local.items() if p not in ignore}
    theirs = {p: b for p, b in remote.items() if p not in ignore}
    if not mine:
        return None, "every build file carries a TPU compile record: nothing to compare before the gate"
    if not theirs:
        return False, "the published release has no build/ files"
    only = sorted(set(mine) ^ set(theirs))
    if only:
        where = "only here" if only[0] in mine else "only in the published release"
        return False, f"{only[0]} is {where}"
    changed = sorted(p for p in mine if mine[p] != theirs[p])
    if changed:
        return False, f"{changed[0]} differs"
    return True, f"{len(mine)} build files identical"
