"""Strings from a server or metadata pass one sanitizer (kernel_hub.ui.display) before the CLI prints them."""

from __future__ import annotations

import pytest

from kernel_hub import cli
from kernel_hub.cli import catalog
from kernel_hub.sources.hub import client as hub_client
from kernel_hub.ui.display import clean, clean_data, clean_lines, one_line

FORGED = ("compile failed\r\x1b[2K\x1b[1A compiled for TPU v5e,v6e: 8/8 all good\nfake line\u202egnp.exe"
          "\u2028\x9b31m\x7f")


def _unsafe(text: str) -> list[str]:
    return [c for c in text if not c.isprintable()]


def test_clean_escapes_every_control_and_format_character() -> None:
    out = clean(FORGED)
    assert _unsafe(out) == []
    for escape in ("\\r", "\\x1b", "\\x0a", "\\u202e", "\\u2028", "\\x9b", "\\x7f"):
        assert escape.replace("\\r", "\\x0d") in out
    assert "compiled for TPU v5e,v6e: 8/8 all good" in out  # the text itself is kept, only defused
    assert clean("ragged-dot-tpu 1.2.0 ü λ") == "ragged-dot-tpu 1.2.0 ü λ"
    assert clean("\u200bzero\u2066width") == "\\u200bzero\\u2066width"


def test_one_line_joins_lines_defuses_and_cuts_the_same_for_the_cli_and_the_hub_client() -> None:
    out = one_line(FORGED, limit=None)
    assert _unsafe(out) == [] and "\n" not in out
    assert out.startswith("compile failed \\x1b[2K") and " fake line\\u202e" in out
    assert one_line("  a  \n\n  b  ") == "a b" and one_line("\n \n") == ""
    cut = one_line("x" * 500, limit=20)
    assert cut == "x" * 17 + "..." and one_line("x" * 500, limit=None) == "x" * 500
    assert len(one_line("y" * 500)) == 300  # the default cap for text of unknown length
    assert hub_client.one_line is one_line  # the hub client's messages pass the same sanitiser


def test_clean_lines_keeps_only_the_cli_s_own_newlines_and_data_is_cleaned_deeply() -> None:
    assert clean_lines("a\x1b[31m\nb\r") == "a\\x1b[31m\nb\\x0d"
    assert clean_data({"k\n": ["x\x1b", ("y\r", 3)], "n": None}) == {"k\\x0a": ["x\\x1b", ("y\\x0d", 3)], "n": None}


def test_info_prints_a_hostile_compile_record_and_metadata_defused(monkeypatch, capsys) -> None:
    hostile = {"repo_id": "evil/k", "source": "hub http://127.0.0.1:1 \x1b]0;title\x07",
               "metadata": {"name": "k\rX", "version": "1.0.0", "license": None, "description": "about\nforged",
                            "python_name": "k", "files": 1, "commit": "a" * 40, "replaces": ["moe\x1b[8m"]},
               "refs": [{"name": "v1\u202e", "kind": "branch", "commit": "b" * 40}], "variants_commit": "c" * 40,
               "variants": [{"name": "jax-tpu", "framework": "jax", "backend": "tpu", "entry": "ops\x1b",
                             "tpu_generations": ["v5e"], "requires": [["jax", ">=0.10\r"]],
                             "tpu_compile": [FORGED, "  v5e 8/8 compiled\x1b[0m"],
                             "signature": {"state": "verified\x1b[2K", "reason": "signed by\nforged"}}]}
    monkeypatch.setattr(catalog, "_info_data", lambda repo: hostile)
    assert cli.main(["info", "evil/k"]) == 0
    out = capsys.readouterr().out
    lines = out.split("\n")
    assert all(_unsafe(line) == [] for line in lines), [line for line in lines if _unsafe(line)]
    assert not any(line.startswith("fake line") or line == "forged" for line in lines)
    assert sum("all good" in line for line in lines) == 1 and any("\\x1b[2K" in line for line in lines)


def test_the_error_line_is_cleaned(monkeypatch, capsys) -> None:
    from kernel_hub.errors import KernelHubError

    def boom(repo):
        raise KernelHubError("server said: \x1b[2Kok\rall good\u202e")

    monkeypatch.setattr(catalog, "_info_data", boom)
    assert cli.main(["info", "evil/k"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and _unsafe(err.rstrip("\n")) == []


@pytest.mark.parametrize("cell", ["a\x1b[31mb", "x\ny"])
def test_tables_clean_their_cells(cell: str) -> None:
    table = cli._table([("h1", "h2"), (cell, "z")])
    assert table.count("\n") == 1 and _unsafe(table.replace("\n", "")) == []
