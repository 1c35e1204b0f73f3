"""A kernel folder read once for publishing, before any of its code runs: kernel.yaml, the package files with their
sha256, the card. Every later stage of publish (validation, the TPU compile gate, the layout) takes this one object.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import IntegrityError, MetadataError
from ..package.integrity import not_source_reason
from ..package.metadata import METADATA_FILE, KernelMetadata, load_metadata
from ..sources.base import LocalSource
from ..tpu.package import VerifiedPackage, from_build, tpu_variant

CARD = "README.md"


def kernel_file(kernel_dir: Path, name: str) -> Path | None:
    """A file of the kernel folder publish reads (kernel.yaml, the card), refused where it is a link that leads
    out of the folder: nothing outside it may be uploaded."""
    path = kernel_dir / name
    if not path.is_file():
        return None
    target = path.resolve()
    if kernel_dir not in target.parents:
        raise IntegrityError(f"{kernel_dir}: {name} is a link to {target}, outside the kernel folder")
    return path


@dataclass(frozen=True)
class KernelFolder:
    """A kernel folder read once, before any of its code runs: kernel.yaml (schema-checked: every name publish
    joins into a path), every file the package ships with its sha256 and the content commit (`source`, a
    LocalSource, which validation loads), and the card."""

    source: LocalSource
    card: Path | None

    @property
    def path(self) -> Path:
        return self.source.kernel_dir

    @property
    def metadata(self) -> KernelMetadata:
        return self.source.metadata

    @property
    def files(self) -> dict[str, Path]:
        """Path inside the package -> the file it is copied from."""
        return self.source.files

    @property
    def digests(self) -> dict[str, str]:
        return self.source.digests

    def tpu_package(self) -> VerifiedPackage:
        """The folder's TPU build as the compile gate takes it, from the files and digests already read."""
        meta = self.metadata
        variant = tpu_variant(meta.variants, meta.repo_id)
        return from_build(self.source.fetch(meta.repo_id, self.source.commit, variant))


def read_kernel_folder(kernel_dir: str | Path) -> KernelFolder:
    """Read and check a kernel folder, before any of the kernel's code runs and before any network call:
    kernel.yaml a plain file inside the folder (metadata.KernelSchema checks every name as it loads), the card
    likewise, the package as a local load assembles it (vendoring.assembled_files, links out of the folder
    refused) holding nothing that runs without its source (bytecode, native code, .pth), and every variant's
    entry among its files."""
    kernel_dir = Path(kernel_dir).resolve()
    kernel_file(kernel_dir, METADATA_FILE)
    meta = load_metadata(kernel_dir)
    card = kernel_file(kernel_dir, CARD)
    source = LocalSource(kernel_dir, meta)
    for rel in source.files:
        reason = not_source_reason(rel)
        if reason is not None:
            raise IntegrityError(f"{kernel_dir / meta.python_name}: {rel} is {reason}; a build ships Python source "
                                 "only")
    for variant in meta.variants:
        if variant.entry not in source.files:
            raise MetadataError(f"variant {variant.name}: entry {variant.entry} not found in {meta.python_name}/")
    return KernelFolder(source, card)
