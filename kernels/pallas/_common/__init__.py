"""Code shared by kernel packages, vendored into each one that lists it.

A kernel's kernel.yaml names the files it uses (`vendor: [dispatch.py, ...]`); kernel-hub copies them, and this
file, into the package as `<python_name>/_vendor/` whenever it assembles the package (the local source, `kernel-hub
publish`, the kernel tests). The package imports them relatively (`from ._vendor.dispatch import Dispatch`), so a
published build holds plain files and loads where only its frameworks are installed. These modules never import
kernel_hub or a kernel package, and import each other only relatively (a vendored file's siblings must be vendored
too). Editing one changes the content digest of every kernel that vendors it: bump their versions.
"""
