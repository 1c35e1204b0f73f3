"""`kernel-hub report`: report.json (its schema, its numbers recounted from its own cases) and index.html, from a
real quick run; timing spreads and ratios against NumPy; the page escapes what it shows.

The quick report (one case per mode and dtype, TPU smoke cases for v5e, three families, one bench) runs once per
module, as a user runs it: `kernel-hub report --quick`. test_report_browser.py renders its page in Chromium.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from kernel_hub.decide.system import installed_version
from kernel_hub.report import schema
from kernel_hub.report.html import render
from kernel_hub.report.schema import Report
from kernel_hub.verify.timing import Ratio, Spread, bench_records, first_and_warm
from tests.hub_server import cli_command

ROOT = Path(__file__).resolve().parents[2]
SEED = 1234


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory) -> tuple[Report, Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("report")
    done = subprocess.run([*cli_command(), "report", "--quick", "--out", str(out), "--seed", str(SEED)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return Report.model_validate_json((out / "report.json").read_text()), out, done


def test_files_and_what_the_command_prints(quick_report):
    report, out, done = quick_report
    assert (out / "index.html").is_file() and (out / "report.json").is_file()
    lines = done.stdout.splitlines()
    assert report.headline.text in lines and f"wrote {out / 'report.json'}" in lines
    assert any(ln.startswith("  pass  kernel-hub/ragged-dot-tpu") and "tpu-interpret" in ln for ln in lines)
    assert any(ln.startswith("  replaced transformers qwen3_moe") for ln in lines)  # live rows, as they finished


def test_environment_is_recorded(quick_report):
    report, _, _ = quick_report
    env = report.environment
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert env.commit == head.strip() and env.seed == SEED == report.validation.seed
    assert env.cpu_cores == os.cpu_count() and env.cpu_model
    for dist in ("jax", "jaxlib", "torch", "transformers", "tokamax"):
        assert env.versions[dist] == installed_version(dist)
    assert "libtpu" in env.versions


def test_headline_and_matrix_recount_the_cases(quick_report):
    report, _, _ = quick_report
    cases = report.validation.cases + report.compile.cases
    assert report.headline.passed == sum(c.passed for c in cases) and report.headline.total == len(cases) > 0
    assert report.headline.text == (f"{report.headline.passed} of {report.headline.total} checks pass "
                                    f"({100 * report.headline.passed / report.headline.total:.1f}%)")
    counted = Counter((c.kernel, c.mode, c.dtype) for c in report.validation.cases)
    assert {(m.kernel, m.column, m.dtype): m.total for m in report.validation.matrix} == dict(counted)
    for m in report.validation.matrix:
        mine = [c for c in report.validation.cases if (c.kernel, c.mode, c.dtype) == (m.kernel, m.column, m.dtype)]
        assert m.passed == sum(c.passed for c in mine) and m.failed == [c.name for c in mine if not c.passed]


def test_every_mode_this_machine_offers_is_covered(quick_report):
    report, _, _ = quick_report
    cells = {(m.kernel, m.column, m.dtype) for m in report.validation.matrix}
    for kernel in ("kernel-hub/ragged-dot-tpu", "kernel-hub/flash-attention-tpu"):
        for mode in ("cpu", "pallas-interpret", "xla", "torch"):
            assert {(kernel, mode, "float32"), (kernel, mode, "bfloat16")} <= cells, (kernel, mode)
        assert (kernel, "tpu-interpret", "float32") in cells
    assert {("kernel-hub/tokamax-attention", "xla_chunked", "float32"),
            ("kernel-hub/tokamax-ragged-dot", "hub_cpu", "bfloat16")} <= cells
    skipped = {(r.kernel, r.framework): r.skipped for r in report.validation.runs if r.skipped}
    assert skipped == {("kernel-hub/tokamax-ragged-dot", "torch"): "no torch build fits here",
                       ("kernel-hub/tokamax-attention", "torch"): "no torch build fits here"}
    for c in report.validation.cases:  # first call (compile + run) apart from the warm median
        assert c.first_call_seconds is not None and c.run_seconds is not None and c.warm_runs >= 1


def test_tpu_compile_section(quick_report):
    report, _, _ = quick_report
    c = report.compile
    if not c.available:
        assert "kernel-hub setup-tpu" in c.reason
        pytest.skip(f"no TPU environment: {c.reason}")
    assert c.generations == ["v5e"] and c.libtpu == report.environment.versions["libtpu"]
    assert {m.kernel for m in c.matrix} == {"kernel-hub/ragged-dot-tpu", "kernel-hub/flash-attention-tpu",
                                            "kernel-hub/tokamax-ragged-dot", "kernel-hub/tokamax-attention",
                                            "kernel-hub/rms-norm-tpu"}
    assert all(x.mode == "tpu-compile" and x.generation == "v5e" and x.compile_seconds for x in c.cases)


def test_family_matrix(quick_report):
    report, _, _ = quick_report
    rows = {r.family: r for r in report.families}
    assert set(rows) == {"qwen3_moe", "llama", "flux"}
    # two decoder layers: Qwen3-MoE has 4 RMSNorms a layer (input, post-attention, q_norm, k_norm) plus the final
    # one, Llama 2 a layer plus the final one; Flux goes through the Diffusers path (processors for attention) with
    # the same kinds: its q/k RMSNorms (4 in the joint block, 2 in the single block)
    assert rows["qwen3_moe"].replaced == {"moe_experts": 2, "attention": 2, "rms_norm": 9}
    assert rows["llama"].replaced == {"attention": 2, "rms_norm": 5}
    assert rows["flux"].replaced == {"attention": 2, "rms_norm": 6}
    for r in rows.values():
        assert r.status == "replaced" and r.restored is True and not r.kept
        assert r.output_error is not None and r.output_error <= 1e-4 and r.max_layer_error <= 1e-4


def test_bench_records_carry_their_spread(quick_report):
    report, _, _ = quick_report
    (bench,) = report.benches
    assert bench.ok and bench.name == "ragged_dot" and bench.baseline == "jax.lax.ragged_dot"
    methods = {r.method: r for r in bench.records}
    assert methods["ours_cpu"].ours and not methods["jax.lax.ragged_dot"].ours
    assert methods["jax.lax.ragged_dot"].vs_baseline is None
    for r in bench.records:
        s = np.array(r.samples_ms)
        assert r.n == len(s) == 3
        assert np.allclose([r.median_ms, r.q1_ms, r.q3_ms, r.min_ms, r.max_ms],
                           [np.median(s), np.percentile(s, 25), np.percentile(s, 75), s.min(), s.max()])
    base = np.array(methods["jax.lax.ragged_dot"].samples_ms)
    ours = methods["ours_cpu"]
    per_round = base / np.array(ours.samples_ms)
    assert ours.vs_baseline["paired"] is True
    assert np.isclose(ours.vs_baseline["value"], np.median(per_round))
    assert np.isclose(ours.vs_baseline["low"], np.percentile(per_round, 25))


def test_schema_document_is_current():
    assert (ROOT / "docs" / "report-schema.json").read_text() == schema.schema_text(), (
        "docs/report-schema.json is stale: run python -m kernel_hub.report.schema")
    doc = (ROOT / "docs" / "report-schema.md").read_text()
    for field in Report.model_fields:
        assert f"`{field}`" in doc, field


# -- units: no report run -----------------------------------------------------------------------------------------


def test_spread_and_ratio_match_numpy():
    samples = [0.003, 0.001, 0.002, 0.010]
    s = Spread.of(samples)
    assert (s.median, s.min, s.max, s.n) == (np.median(samples), 0.001, 0.010, 4)
    assert np.isclose(s.q1, np.percentile(samples, 25)) and np.isclose(s.q3, np.percentile(samples, 75))
    r = Ratio.of([2.0, 4.0, 6.0], [1.0, 1.0, 2.0])  # per round: 2, 4, 3
    assert (r.value, r.low, r.high, r.paired) == (3.0, 2.5, 3.5, True)
    assert str(r) == "3.00x faster (2.50-3.50)" and r.of_medians == 4.0  # 3 vs 4: 25% apart, at the tolerance
    assert str(Ratio(12.34, 11.0, 13.0, True)) == "12.3x faster (11.0-13.0)"
    unpaired = Ratio.of([4.0, 4.0, 4.0, 8.0], [1.0, 2.0])  # medians 4 / 1.5; quartiles 4..5 over 1.25..1.75
    assert not unpaired.paired and np.isclose(unpaired.value, 4 / 1.5)
    assert np.isclose(unpaired.low, 4 / 1.75) and np.isclose(unpaired.high, 5 / 1.25)
    with pytest.raises(ValueError):
        Spread.of([])


def test_bench_records_shape():
    recs = bench_records({"base": [0.002, 0.004], "ours": [0.001, 0.001]}, group="g", baseline="base", dtype="f32")
    assert [r["method"] for r in recs] == ["base", "ours"] and all(r["dtype"] == "f32" for r in recs)
    assert recs[0]["vs_baseline"] is None and recs[1]["vs_baseline"]["value"] == 3.0  # rounds: 2x and 4x
    assert recs[1]["samples_ms"] == [1.0, 1.0] and recs[0]["median_ms"] == 3.0


def test_first_and_warm_counts_calls():
    calls = []
    result, first, warm = first_and_warm(lambda: calls.append(1) or len(calls), runs=3, budget_s=60)
    assert result == 1 and len(calls) == 4 and len(warm) == 3 and first >= 0
    calls.clear()
    _, _, warm = first_and_warm(lambda: calls.append(1), runs=3, budget_s=0)  # budget spent: one warm call
    assert len(calls) == 2 and len(warm) == 1


def test_interleaved_gap_idles_before_each_timed_call_and_is_not_timed():
    import time

    from kernel_hub.verify.timing import interleaved_samples

    order: list[str] = []
    start = time.perf_counter()
    samples = interleaved_samples({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=3,
                                  warmup=1, gap_s=0.03)
    elapsed = time.perf_counter() - start
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warmup, then rounds with the order rotated
    assert elapsed >= 6 * 0.03  # one gap before each of the six timed calls
    assert all(len(v) == 3 and max(v) < 0.03 for v in samples.values())  # the gap is outside the timed region


def test_interleaved_calls_time_back_to_back_calls_and_report_their_mean():
    import time

    from kernel_hub.verify.timing import interleaved_samples

    order: list[str] = []

    def slow() -> None:
        order.append("s")
        time.sleep(0.02)

    samples = interleaved_samples({"s": slow, "f": lambda: order.append("f")}, repeats=2, warmup=0, calls=3)
    assert order == ["s"] * 3 + ["f"] * 3 + ["f"] * 3 + ["s"] * 3  # three calls per sample, rounds rotated
    assert all(0.02 <= t < 0.04 for t in samples["s"])  # the mean of three 20 ms calls, not their sum
    with pytest.raises(ValueError, match="calls"):
        interleaved_samples({"f": lambda: None}, calls=0)


def test_validate_reports_seed_and_progress(toy_kernel):
    import kernel_hub as kh

    seen = []
    report = kh.validate(kh.get_local_kernel(toy_kernel, backend="cpu"), backend="cpu", seed=77,
                         on_start=lambda n: seen.append(("start", n)),
                         on_case=lambda i, n, c: seen.append((i, n, c.name)))
    assert report.seed == 77 and seen == [("start", 2), (0, 2, "small_f32"), (1, 2, "empty")]
    assert str(report).splitlines()[0].endswith("seed 77") and json.loads(report.to_json())["seed"] == 77
    assert all(c.first_call_seconds is not None and c.warm_runs >= 1 for c in report.cases)


def test_quick_selection_keeps_one_case_per_mode_and_dtype():
    import kernel_hub as kh
    from kernel_hub.verify.validation import case_mode, quick_selection

    module = kh.get_kernel("kernel-hub/ragged-dot-tpu", backend="cpu")
    import importlib

    cases = importlib.import_module(f"{module.__name__}.validation").cases("cpu")
    picked = quick_selection(cases)
    keys = [(case_mode(c), c.dtype) for c in picked]
    assert len(keys) == len(set(keys)) and set(keys) == {(case_mode(c), c.dtype) for c in cases}
    assert {"cpu", "pallas-interpret", "tpu-interpret", "xla"} == {m for m, _ in keys}


def test_page_escapes_what_it_shows():
    """Error messages, case names and reasons come from kernels and models: the page shows them as text."""
    env = schema.Environment(date="2026-01-01T00:00:00+00:00", commit=None, dirty=None, python="3.11",
                             platform="linux", machine="x86_64", cpu_model="<b>cpu</b>", cpu_cores=2, usable_cores=2,
                             versions={"jax": "0.10.2"}, seed=1)
    evil = "<script>alert(1)</script>"
    case = schema.CaseRow(kernel="acme/k", framework="jax", mode="cpu", generation=None, name=f"case{evil}",
                          dtype="float32", implementation="cpu", passed=False, max_error=float("nan"), tolerance=1e-4,
                          run_seconds=0.1, first_call_seconds=0.2, compile_seconds=0.1, warm_runs=1, cached=False,
                          error=evil)
    fam = schema.FamilyRow(family="x", library="transformers", kind="moe", status="kept", replaced={}, kept={"a": 1},
                           reasons=[f"a: {evil}"], max_layer_error=None, output_error=None, restored=True, seconds=1)
    from kernel_hub.report.assemble import headline
    from kernel_hub.report.validation_section import matrix

    validation = schema.Validation(seed=1, runs=[], cases=[case], matrix=matrix([case], "mode", by_dtype=True))
    compile_ = schema.Compile(available=False, reason=evil, generations=[], selection="smoke", jax=None, libtpu=None,
                              cases=[], matrix=[])
    report = Report(quick=True, seconds=1.0, environment=env, headline=headline(validation, compile_, [fam]),
                    validation=validation, compile=compile_, families=[fam], benches=[])
    page = render(report)
    assert "<script>" not in page and page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 4
    assert "&lt;b&gt;cpu&lt;/b&gt;" in page
    assert report.validation.cases[0].max_error is None  # NaN is stored as null: report.json stays strict JSON
    json.loads(report.model_dump_json())


# -- the page in a real browser -----------------------------------------------------------------------------------

# Chromium 156 still asks clients2.google.com (network time), update.googleapis.com and accounts.google.com with
# --disable-background-networking (the session's loopback recorder caught it), so its proxy is a closed loopback
# port: the page is a file, and nothing Chromium tries on its own can leave the machine.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--no-pings",
                  "--disable-domain-reliability", "--disable-features=NetworkTimeServiceQuerying",
                  "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>")


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    import shutil

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("Chromium is not installed (Debian package `chromium`; `make test` installs it)")
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    done = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


class _Dom(HTMLParser):
    """The dumped DOM as a flat list of (tag, attributes, text directly inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], list[str]]] = []
        self.stack: list[int] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, {k: v or "" for k, v in attrs}, []))
        if tag not in ("br", "meta", "path", "use", "rect", "circle", "line", "polyline", "image"):
            self.stack.append(len(self.elements) - 1)

    def handle_endtag(self, tag):
        while self.stack:
            if self.elements[self.stack.pop()][0] == tag:
                break

    def handle_data(self, data):
        if self.stack and data.strip():
            self.elements[self.stack[-1]][2].append(data.strip())

    def find(self, tag: str, **attrs: str) -> list[tuple[str, dict[str, str], list[str]]]:
        return [e for e in self.elements if e[0] == tag and all(e[1].get(k) == v for k, v in attrs.items())]


def test_page_renders_in_chromium(quick_report, tmp_path):
    report, out, _ = quick_report
    url = (out / "index.html").as_uri()
    dom = _Dom()
    dom.feed(chromium(tmp_path, "--dump-dom", url).stdout)

    (rate,) = dom.find("div", id="pass-rate")
    assert rate[2] == [f"{100 * report.headline.rate:.1f}%"]
    texts = [" ".join(e[2]) for e in dom.find("strong")]
    assert report.headline.text in texts

    for cell in report.validation.matrix:  # every matrix cell is on the page with its numbers
        (td,) = dom.find("td", **{"data-kernel": cell.kernel, "data-column": cell.column, "data-dtype": cell.dtype})
        state = "pass" if cell.passed == cell.total else "fail" if cell.passed == 0 else "part"
        assert td[2] == [f"{cell.passed}/{cell.total}"] and state in td[1]["class"].split()
    for cell in report.compile.matrix:
        (td,) = dom.find("td", **{"data-kernel": cell.kernel, "data-column": cell.column, "data-dtype": ""})
        assert td[2] == [f"{cell.passed}/{cell.total}"]
    for fam in report.families:
        (tr,) = dom.find("tr", **{"data-family": fam.family})
        assert tr[1]["data-status"] == fam.status

    # the bench plot is an inline SVG whose median markers and IQR bars carry path data
    figures = dom.find("figure", **{"data-bench": "ragged_dot"})
    assert len(figures) == 1 and dom.find("svg")
    ids = {e[1]["id"] for e in dom.find("g") if "id" in e[1]}
    for method in ("ours-cpu", "jax-lax-ragged-dot", "tokamax-xla"):
        assert f"ragged-dot-pallas-small-e8-float32-median-{method}" in ids
        assert f"ragged-dot-pallas-small-e8-float32-iqr-{method}" in ids
    i = next(n for n, e in enumerate(dom.elements) if e[1].get("id") == "ragged-dot-pallas-small-e8-float32-median-"
             "ours-cpu")
    path = next(e for e in dom.elements[i:] if e[0] in ("path", "use"))
    assert path[1].get("d") or path[1].get("xlink:href") or path[1].get("href")


def test_screenshot_shows_the_plot_colours(quick_report, tmp_path):
    """Rendered, not just parsed: the plot's marker colours (used nowhere else on the page) are on screen."""
    from PIL import Image

    from kernel_hub.report.plots import BASELINE_COLOUR, OURS_COLOUR

    _, out, _ = quick_report
    shot = tmp_path / "page.png"
    chromium(tmp_path, "--window-size=1300,5000", "--hide-scrollbars", f"--screenshot={shot}",
             (out / "index.html").as_uri())
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
    for colour in (OURS_COLOUR, BASELINE_COLOUR):
        rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
        assert (np.abs(pixels - rgb).max(axis=1) <= 8).sum() >= 30, colour
    green = np.array([0xd3, 0xf9, 0xd8])  # passing matrix cells
    assert (np.abs(pixels - green).max(axis=1) <= 2).sum() >= 1000
