"""README.md stays short enough to read, and no link in README.md or docs/*.md leads nowhere: every relative
link names a file in the checkout, and a `#section` names a heading of that page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: README.md's ceiling: the newcomer's page holds the two commands, the examples, the tables and links only.
README_MAX_BYTES = 11_000

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text with code blocks and code spans blanked: a link or heading inside code is not one."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(h) for h in _HEADING.findall(_FENCE.sub("", page.read_text()))}


def broken_links(page: Path, root: Path) -> list[str]:
    """Each relative link of `page` that names no file under `root`, or no heading of the page it names."""
    broken = []
    for target in _LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_relative_to(root.resolve()) or not dest.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no heading #{fragment} in {dest.name})")
    return broken


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def test_readme_stays_short():
    size = len((ROOT / "README.md").read_bytes())
    assert size < README_MAX_BYTES, f"README.md is {size} bytes (at most {README_MAX_BYTES}): move detail to docs/"


def test_every_relative_link_resolves():
    broken = {p.relative_to(ROOT).as_posix(): b for p in pages() if (b := broken_links(p, ROOT))}
    assert not broken, f"links that lead nowhere: {broken}"


def test_the_index_links_every_page_and_the_readme_links_the_index():
    index = _prose((DOCS / "README.md").read_text())
    linked = {Path(t.partition("#")[0]).name for t in _LINK.findall(index)}
    unlisted = sorted(p.name for p in DOCS.glob("*.md") if p.name != "README.md" and p.name not in linked)
    assert not unlisted, f"docs/README.md does not link: {unlisted}"
    assert "docs/README.md" in _LINK.findall(_prose((ROOT / "README.md").read_text()))


def test_the_checker_finds_broken_links(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Two `words`\n\n```sh\n# not a heading\n```\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md) [ok](docs/a.md#two-words) [ok](#top) [web](https://example.org/x)\n"
                    "# Top\n`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n"
                    "[gone](docs/b.md) [bad anchor](docs/a.md#not-a-heading) [out](../outside.md)\n")
    assert broken_links(page, tmp_path) == ["docs/b.md (no such file)",
                                            "docs/a.md#not-a-heading (no heading #not-a-heading in a.md)",
                                            "../outside.md (no such file)"]


def test_anchor_follows_github():
    assert anchor("Cache, environment variables and trust") == "cache-environment-variables-and-trust"
    assert anchor("`kernel-hub init`: the templates") == "kernel-hub-init-the-templates"
    assert anchor("Calibration: the model against measured TPU times") == \
        "calibration-the-model-against-measured-tpu-times"


def _serve_default_port() -> int:
    from kernel_hub.cli.parser import build_parser

    args = build_parser().parse_args(["serve", "--store", "unused"])
    return args.port


def test_recipes_use_the_port_serve_listens_on():
    """Every local endpoint the README, docs and `kernel-hub init`'s templates show is the one `kernel-hub serve`
    listens on by default: a recipe pointing at another port fails for whoever follows it."""
    templates = ROOT / "src" / "kernel_hub" / "scaffold" / "templates"
    texts = {p.relative_to(ROOT).as_posix(): p.read_text() for p in [*pages(), *templates.rglob("*")]
             if p.is_file()}
    ports = {(name, int(port)) for name, text in texts.items()
             for port in re.findall(r"(?:127\.0\.0\.1|localhost):(\d+)\b(?!/v1/)", text)}  # /v1/: OpenAI API
    assert any(name == "README.md" for name, _ in ports)  # the recipes were read
    port = _serve_default_port()
    assert not {(name, p) for name, p in ports if p != port}, f"kernel-hub serve listens on {port}"
