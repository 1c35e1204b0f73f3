"""transformers' own server (`transformers serve`) on a kernelized model: the model loads exactly as transformers loads
it, then `kh.kernelize` runs on it in the model's process, before the first request.

The hook is transformers' public `ModelLoader.load_model_and_processor` (cli/serving/model_manager.py): the model's
process calls it on a pickled copy of the server's loader, so a subclass that kernelizes what it returns travels there
by itself. `Serve` builds its `ModelLoader` in `__init__` and starts serving at once; `KernelizedServe` puts its own
loader in before `run` / `run_api_servers` reads `self.loader`. Nothing else of transformers is patched: the app, the
handlers, continuous batching and the OpenAI API are transformers'. Importing this module imports transformers' serving
code (fastapi, uvicorn, openai): only `kernel-hub serve-model` does, when it runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from transformers.cli.serve import Serve
from transformers.cli.serving.model_manager import ModelLoader

if TYPE_CHECKING:
    import socket
    from collections.abc import Callable

    from transformers import PreTrainedModel, PreTrainedTokenizerFast, ProcessorMixin

    from ..layers.report import KernelizeReport


@dataclass(frozen=True)
class KernelizeSettings:
    """What `kh.kernelize` gets in the model's process (picklable: it travels with the loader)."""

    mapping: dict[str, str | None] = field(default_factory=dict)
    validate: bool = True
    strict: bool = False
    quantize: str | None = None
    trust_remote_code: bool | list[str] = False
    report_path: str | None = None


class KernelizingLoader(ModelLoader):
    """transformers' loader, and `kh.kernelize` on the model it loads; the report goes to stderr (one line) and, with
    `report_path`, to that file as JSON (`KernelizeReport.to_json`)."""

    def __init__(self, settings: KernelizeSettings, **loader_args: object) -> None:
        super().__init__(**loader_args)  # type: ignore[arg-type]
        self.kernelize_settings = settings

    def load_model_and_processor(
        self, model_id: str, on_progress: Callable | None = None
    ) -> tuple[PreTrainedModel, ProcessorMixin | PreTrainedTokenizerFast]:
        model, processor = super().load_model_and_processor(model_id, on_progress)
        if on_progress is not None:
            on_progress({"status": "loading", "model": model_id, "stage": "kernelize"})
        return kernelize_loaded(model, self.kernelize_settings, model_id), processor


def kernelize_loaded(model: PreTrainedModel, settings: KernelizeSettings, model_id: str) -> PreTrainedModel:
    """`kh.kernelize` with `settings`, its report said on stderr and written where asked."""
    import kernel_hub as kh

    model = kh.kernelize(model, mapping=dict(settings.mapping) or None, validate=settings.validate,
                         strict=settings.strict, quantize=settings.quantize,
                         trust_remote_code=settings.trust_remote_code)
    report = kh.kernelize_report(model)
    print(f"kernel-hub serve-model: {model_id}: {summary_line(report)}", file=sys.stderr, flush=True)
    if settings.report_path:
        Path(settings.report_path).write_text(report.to_json() + "\n")
    return model


def summary_line(report: KernelizeReport) -> str:
    """The report in one line: the count, then which kernel each kind runs on."""
    kernels = sorted({f"{r.kind} -> {r.repo_id}" for r in report.replaced})
    return report.summary() + (f" ({', '.join(kernels)})" if kernels else "")


class KernelizedServe(Serve):
    """`transformers serve` whose model process loads through `loader` (a KernelizingLoader). `serve_args` are
    `Serve`'s own keyword arguments; `Serve.__init__` starts serving, so this call returns when the server stops."""

    def __init__(self, loader: KernelizingLoader, **serve_args: object) -> None:
        self._kernelizing_loader = loader
        super().__init__(**serve_args)  # type: ignore[arg-type]

    def run(self, socket: socket.socket | None = None, engine_connection: tuple | None = None) -> None:
        self.loader = self._kernelizing_loader
        super().run(socket, engine_connection)

    def run_api_servers(self, count: int) -> None:
        self.loader = self._kernelizing_loader
        super().run_api_servers(count)
