"""A flag never consumes a positional: every command that takes repo ids acts on the repo it is given, wherever
the flags stand (`kernel-hub validate --trust-remote-code acme/gelu-tpu` validates acme/gelu-tpu)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kernel_hub import cli
from kernel_hub.errors import KernelHubError

REPO = "acme/gelu-tpu"


class Reached(KernelHubError):
    """Raised by a stand-in for a command's work: the command got as far as acting on a repo."""


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _repo_commands() -> dict[str, argparse.ArgumentParser]:
    """The commands with a positional naming repo ids."""
    return {name: p for name, p in _subparsers().items()
            if any(not a.option_strings and a.dest in ("repo", "repos") for a in p._actions)}


def test_the_commands_that_take_repo_ids_are_the_ones_tested_below() -> None:
    assert set(_repo_commands()) == {"info", "resolve", "validate", "download", "lock", "bench"}


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_no_option_takes_a_variable_number_of_words(command: str) -> None:
    """An option with an optional or open-ended value (nargs ?, *, +) would take the positional after it."""
    loose = [a.option_strings for a in _subparsers()[command]._actions
             if a.option_strings and a.nargs in ("?", "*", "+")]
    assert loose == []


@pytest.mark.parametrize("command", sorted(_repo_commands()))
def test_every_flag_before_the_repo_leaves_the_repo_alone(command: str) -> None:
    """Each option of the command, put before the repo id (with one value where it takes one), still parses
    the repo id as the repo."""
    parser = cli.build_parser()
    sub = _repo_commands()[command]
    values = {"--tpu": "v5e", "--backend": "cpu", "--framework": "jax", "--tag": "decode", "--seed": "1",
              "--tpu-cases": "smoke", "--trust": "acme"}
    tried = []
    for action in sub._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        flag = action.option_strings[-1]
        words = [flag] if action.nargs == 0 else [flag, values.get(flag, "x")]
        args = parser.parse_args([command, *words, REPO])
        got = getattr(args, "repos", None) or getattr(args, "repo", None)
        assert got in (REPO, [REPO]), (flag, got)
        tried.append(flag)
    if command in ("validate", "lock"):
        assert {"--trust-remote-code", "--trust", "--backend"} <= set(tried)


def _record(monkeypatch: pytest.MonkeyPatch, module: str, name: str, seen: list[str], pick) -> None:
    def stand_in(*args, **kwargs):
        seen.append(pick(*args, **kwargs))
        raise Reached("stopped here")

    monkeypatch.setattr(f"kernel_hub.cli.{module}.{name}", stand_in)


class _Registry:
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def require(self, repo_id: str):
        self.seen.append(repo_id)
        raise Reached("stopped here")


# (argv, module and function a stand-in replaces, how to read the repo id from its arguments)
ACTED_ON = {
    "validate": (["validate", "--trust-remote-code", REPO], "loading", "get_kernel", lambda repo, **_: repo),
    "validate-listed": (["validate", "--trust-remote-code=acme", "--trust", "other", REPO], "loading", "get_kernel",
                        lambda repo, **_: repo),
    "lock": (["lock", "--trust-remote-code", REPO, "other/x"], "loading", "lock", lambda repos, **_: repos),
    "info": (["info", "--json", REPO], "catalog", "_info_data", lambda repo: repo),
    "resolve": (["resolve", "--backend", "cpu", "--json", REPO], "catalog", "plan_load", lambda repo, **_: repo),
    "download": (["download", "--json", "--backend", "cpu", REPO], "loading", "plan_load", lambda repo, **_: repo),
}


@pytest.mark.parametrize("case", sorted(ACTED_ON))
def test_the_named_repo_is_the_one_acted_on(case: str, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture) -> None:
    argv, module, name, pick = ACTED_ON[case]
    seen: list = []
    _record(monkeypatch, module, name, seen, pick)
    assert cli.main(argv) == 1
    assert "stopped here" in capsys.readouterr().err
    want = [REPO, "other/x"] if case == "lock" else REPO
    assert seen == [want]


def test_bench_acts_on_the_named_repo(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    seen: list[str] = []
    monkeypatch.setattr("kernel_hub.cli.tools.load_registry", lambda: _Registry(seen))
    assert cli.main(["bench", REPO, "--quick"]) == 1
    assert seen == [REPO]


def test_the_trust_flags_reach_the_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bare: every repo; --trust / --trust-remote-code=LIST: those; both: every repo; neither: none."""
    parser = cli.build_parser()
    read = {
        (): False,
        ("--trust-remote-code",): True,
        ("--trust-remote-code=acme,kernel-hub/x",): ["acme", "kernel-hub/x"],
        ("--trust", "acme", "--trust", "b/c"): ["acme", "b/c"],
        ("--trust=acme,b/c",): ["acme", "b/c"],
        ("--trust", "acme", "--trust-remote-code"): True,
        ("--trust-remote-code", "--trust", "acme"): True,
    }
    for command in ("validate", "lock"):
        for flags, want in read.items():
            args = parser.parse_args([command, *flags, REPO])
            assert cli.trust_setting(args.trust_remote_code) == want, flags
            assert (args.repo if command == "validate" else args.repos) in (REPO, [REPO])


def test_an_old_style_trust_value_is_refused_with_the_new_spelling(capsys: pytest.CaptureFixture) -> None:
    """`validate REPO --trust-remote-code acme` once trusted acme; now the extra word is refused, naming how to
    list repos, rather than read as something else."""
    assert cli.main(["validate", REPO, "--trust-remote-code", "acme"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: acme" in err and "--trust-remote-code=ORG" in err and "--trust ORG" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("bad", ["--trust=,", "--trust-remote-code=acme,,b"])
def test_an_empty_trust_entry_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["validate", REPO, bad]) == 2
    assert "ORG or ORG/NAME" in capsys.readouterr().err


def test_words_after_a_double_dash_are_not_rewritten() -> None:
    assert cli.common.split_trust_values(["--trust-remote-code=a", "--", "--trust-remote-code=b"]) == [
        "--trust", "a", "--", "--trust-remote-code=b"]


def test_validate_and_lock_run_on_the_named_kernel(toy_registry: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    """End to end on the toy registry (the default ragged dot is not in it): the flag before the repo id."""
    repo = "test-org/toy-scale"
    assert cli.main(["validate", "--trust-remote-code", repo, "--backend", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["repo_id"] == repo
    out = tmp_path / "k.lock"
    assert cli.main(["lock", "--trust-remote-code", repo, "--backend", "cpu", "-o", str(out)]) == 0
    assert [k["repo_id"] for k in json.loads(out.read_text())["kernels"]] == [repo]


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture) -> None:
    """`kernel-hub --version` (and -V): the version pyproject.toml declares; after a command --version stays the
    kernel's version spec."""
    import tomllib

    declared = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["version"]
    for flag in ("--version", "-V"):
        assert cli.main([flag]) == 0
        assert capsys.readouterr().out == f"kernel-hub {declared}\n"
    assert cli.build_parser().parse_args(["validate", "--version", "1", REPO]).spec == "1"
