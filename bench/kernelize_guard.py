"""What the whole-model weights guard costs kernelize: the same kernelize run side by side with the guard watching the
whole model (the default) and with it watching only the layer validated (the scope switched off), alternating.

    python bench/kernelize_guard.py [--families qwen2_moe qwen3_moe] [--repeats 7]

Prints, per tiny model family, the median and spread (min..max) of each and their ratio. A tiny model on a shared CPU
is noisy: read the ratio with the spread.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import torch

import kernel_hub as kh
import kernel_hub.layers.api as layers_api
from kernel_hub.report.models import tiny_model


def _timed(model) -> float:
    start = time.perf_counter()
    kh.kernelize(model)
    seconds = time.perf_counter() - start
    kh.restore(model)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["qwen2_moe", "qwen3_moe"])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    whole_model = layers_api.guarding
    print(f"{'family':12s} {'whole model (ms)':>26s} {'layer only (ms)':>26s} {'ratio':>6s}")
    for family in args.families:
        model = tiny_model(family, dtype=torch.float32)
        kh.restore(kh.kernelize(model))  # warm: kernels loaded and compiled once
        times: dict[str, list[float]] = {"whole": [], "layer": []}
        for _ in range(args.repeats):
            layers_api.guarding = whole_model
            times["whole"].append(_timed(model))
            layers_api.guarding = lambda _model: contextlib.nullcontext()
            times["layer"].append(_timed(model))
        layers_api.guarding = whole_model
        cell = {k: f"{statistics.median(v) * 1e3:7.1f} ({min(v) * 1e3:.0f}..{max(v) * 1e3:.0f})"
                for k, v in times.items()}
        ratio = statistics.median(times["whole"]) / statistics.median(times["layer"])
        print(f"{family:12s} {cell['whole']:>26s} {cell['layer']:>26s} {ratio:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
