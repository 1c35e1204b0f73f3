"""HF `kernels`' conventions that kernel-hub honours, each a small pure decision over its input.

- LOCAL_KERNELS: `repo_id=path:repo_id=path`; a mapped repo loads from that folder (here: a kernel folder holding
  kernel.yaml) instead of any Hub, as HF kernels 0.19.1 does. Local folders are the user's own code: no trust check.
- KERNELS_CACHE: where Hub downloads are cached (HF kernels passes it to hf_hub_download as cache_dir); kernel-hub
  caches its Hub builds under the same root.
- kernels-minver (metadata.json): the oldest HF kernels whose build format a build needs. kernel-hub reads the
  format up to SUPPORTED_FORMAT's minor version; a build asking for a newer one is refused before import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ..errors import KernelHubError, UnsafeNameError
from ..names import check_repo_id

LOCAL_KERNELS_ENV = "LOCAL_KERNELS"
KERNELS_CACHE_ENV = "KERNELS_CACHE"
#: The HF kernels release whose build format (metadata.json, layouts, variant names) kernel-hub implements.
SUPPORTED_FORMAT = "0.19.1"


def parse_local_kernels(value: str) -> dict[str, Path]:
    """LOCAL_KERNELS' text -> {repo_id: folder}; KernelHubError naming the entry and the format otherwise."""
    out: dict[str, Path] = {}
    for entry in value.split(":"):
        if not entry.strip():
            continue
        repo_id, sep, path = entry.partition("=")
        if not sep or not path:
            raise KernelHubError(f"{LOCAL_KERNELS_ENV} entry {entry!r} is not repo_id=path "
                                 f"(format: org/a=/path/a:org/b=/path/b)")
        try:
            out[check_repo_id(repo_id.strip(), f"{LOCAL_KERNELS_ENV} repo id")] = Path(path).expanduser()
        except UnsafeNameError as exc:
            raise KernelHubError(str(exc)) from None
    return out


def local_override(repo_id: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """The folder LOCAL_KERNELS maps `repo_id` to (None: not mapped); KernelHubError when the folder is not a
    kernel folder."""
    environ = os.environ if environ is None else environ
    value = environ.get(LOCAL_KERNELS_ENV)
    if not value:
        return None
    folder = parse_local_kernels(value).get(repo_id)
    if folder is None:
        return None
    if not (folder / "kernel.yaml").is_file():
        raise KernelHubError(f"{LOCAL_KERNELS_ENV} maps {repo_id} to {folder}, which holds no kernel.yaml "
                             "(kernel-hub loads kernel folders from there; HF build trees load with HF kernels)")
    return folder


def kernels_cache(environ: Mapping[str, str] | None = None) -> Path | None:
    """KERNELS_CACHE as a folder, or None when unset (then huggingface_hub's HF_HUB_CACHE)."""
    environ = os.environ if environ is None else environ
    value = environ.get(KERNELS_CACHE_ENV)
    return Path(value).expanduser() if value else None


def minver_decision(required: str | None, supported: str = SUPPORTED_FORMAT) -> tuple[bool, str]:
    """(loadable, reason) for a build whose metadata.json says kernels-minver `required`: loadable when it asks
    for no newer a minor version than `supported`. Pure."""
    if required is None:
        return True, "no kernels-minver"
    try:
        asked, have = Version(required), Version(supported)
    except InvalidVersion:
        return False, f"kernels-minver {required!r} is not a version"
    if asked.release[:2] <= have.release[:2]:
        return True, f"kernels-minver {required} is within the format kernel-hub reads (kernels {supported})"
    return False, (f"it needs the build format of kernels >= {required}; this kernel-hub reads the format of kernels "
                   f"{supported}: upgrade kernel-hub, or load an older version of the kernel")
