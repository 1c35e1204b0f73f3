"""One version, one content: the checked-in record of every kernel version's content digest.

`kernels/pallas/releases.yaml` maps each kernel folder to {version: content commit} (vendoring.content_commit:
kernel.yaml and every assembled file, vendored shared code included). A kernel whose files changed while its
version did not is a second, different build under a released name; `check` finds it (tests/package/test_releases.py
runs it) and `record` refuses to overwrite a recorded version. The fix is always the same: bump the version in
kernel.yaml, then record the new one:

    python -m kernel_hub.package.releases [--root kernels/pallas]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from ..errors import KernelHubError, MetadataError
from .metadata import METADATA_FILE, load_metadata, read_yaml
from .vendoring import COMMON_DIR, assembled_files, content_commit, file_digests

RECORD_FILE = "releases.yaml"
RECORD_COMMAND = "python -m kernel_hub.package.releases"
_HEADER = f"""\
# Content digest of every kernel version: kernel folder -> version -> the commit id kernel-hub gives its content
# (kernel.yaml plus every shipped file, vendored _common/ files included). A version's content never changes: when
# a kernel's files (or a shared file it vendors) change, bump its version in kernel.yaml and record the new one
# with `{RECORD_COMMAND}`. tests/package/test_releases.py fails until you do.
"""


def kernel_dirs(root: Path) -> list[Path]:
    """The kernel folders under `root` (each holds a kernel.yaml), in name order."""
    return sorted(p.parent for p in Path(root).glob(f"*/{METADATA_FILE}") if p.parent.name != COMMON_DIR)


def current(kernel_dir: Path) -> tuple[str, str]:
    """(version in kernel.yaml, content commit of the folder as it is now)."""
    meta = load_metadata(kernel_dir)
    return meta.version, content_commit(kernel_dir, meta, file_digests(assembled_files(kernel_dir, meta)))


def read_record(root: Path) -> dict[str, dict[str, str]]:
    path = Path(root) / RECORD_FILE
    if not path.is_file():
        return {}
    data = read_yaml(path) or {}
    ok = isinstance(data, dict) and all(
        isinstance(k, str) and isinstance(v, dict) and all(isinstance(a, str) and isinstance(b, str)
                                                            for a, b in v.items()) for k, v in data.items())
    if not ok:
        raise MetadataError(f"{path}: expected {{kernel folder: {{version: digest}}}} with quoted versions")
    return data


def _states(root: Path, data: dict[str, dict[str, str]]) -> list[tuple[Path, str, str, str | None]]:
    """(kernel folder, its version, its content digest now, the digest recorded for that version or None)."""
    out = []
    for kernel_dir in kernel_dirs(root):
        version, digest = current(kernel_dir)
        out.append((kernel_dir, version, digest, data.get(kernel_dir.name, {}).get(version)))
    return out


def check(root: Path) -> list[str]:
    """One line per kernel whose current content is not what its version recorded (empty: all consistent)."""
    problems = []
    for kernel_dir, version, digest, recorded in _states(root, read_record(root)):
        if recorded is None:
            problems.append(f"kernel {kernel_dir.name} version {version} is not recorded in {root}/{RECORD_FILE}: "
                            f"record it with `{RECORD_COMMAND}`")
        elif recorded != digest:
            problems.append(f"kernel {kernel_dir.name} changed since version {version} was recorded (content "
                            f"{digest[:12]}, recorded {recorded[:12]}): bump its version in "
                            f"{kernel_dir / METADATA_FILE} and re-record with `{RECORD_COMMAND}`")
    return problems


def record(root: Path) -> list[str]:
    """Record every kernel's current version; refuses (KernelHubError) to change what a version recorded."""
    data = read_record(root)
    added = []
    for kernel_dir, version, digest, recorded in _states(root, data):
        if recorded not in (None, digest):
            raise KernelHubError(f"kernel {kernel_dir.name} version {version} is recorded with other content: "
                                 f"bump its version in {kernel_dir / METADATA_FILE} first, then re-record")
        if recorded is None:
            data.setdefault(kernel_dir.name, {})[version] = digest
            added.append(f"{kernel_dir.name} {version} {digest[:12]}")
    body = yaml.safe_dump({k: data[k] for k in sorted(data)}, sort_keys=True, default_flow_style=False)
    (Path(root) / RECORD_FILE).write_text(_HEADER + body)
    return added


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=RECORD_COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="kernels/pallas", help="folder of kernel folders (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="only report kernels whose content is not recorded")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = check(Path(args.root))
            for line in problems:
                print(line)
            return 1 if problems else 0
        for line in record(Path(args.root)) or ["nothing new to record"]:
            print(line)
    except KernelHubError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
