"""The one trust check: a pure decision on the repo actually fetched, HF kernels' meaning for lists, and an error
that names the flag the CLI really has."""

from __future__ import annotations

import pytest

from kernel_hub import cli
from kernel_hub.errors import TrustError
from kernel_hub.load.trust import NOTHING_EXTRA, TrustPolicy, check_trust, trust_decision, trust_policy
from kernel_hub.sources.base import Origin

ORGS = ("kernel-hub", "kernels-community")
HUB = Origin("hub", "acme/ragged", "http://127.0.0.1:8080")


@pytest.mark.parametrize(
    ("origin", "setting", "allowed"),
    [
        (Origin("local", "acme/ragged", "/src/ragged"), False, True),   # a folder the user has
        (Origin("hub", "kernel-hub/x", "http://h"), False, True),       # a trusted organisation
        (HUB, False, False),
        (HUB, None, False),
        (HUB, True, True),
        (HUB, ["acme/ragged"], True),                                   # the repo itself
        (HUB, ["acme"], True),                                          # its organisation
        (HUB, "acme", True),                                            # one entry as a plain string
        (HUB, ("other/repo", "acme"), True),
        (HUB, ["other/repo"], False),                                   # a list trusts what it names, nothing else
        (HUB, ["acme/other", "acme-corp", "acme/ragged-2"], False),
        (HUB, [], False),
        (Origin("hub", "evil/y", "http://h"), ["kernel-hub/x"], False),  # an alias's own name does not count
    ],
)
def test_trust_decision(origin: Origin, setting, allowed: bool) -> None:
    ok, reason = trust_decision(origin, trust_policy(setting), ORGS)
    assert ok is allowed and reason


@pytest.mark.parametrize(("setting", "policy"), [
    (None, NOTHING_EXTRA), (False, NOTHING_EXTRA), (True, TrustPolicy(everything=True)),
    ("acme", TrustPolicy(named=("acme",))), (["acme", "x/y"], TrustPolicy(named=("acme", "x/y"))),
    (iter(["acme"]), TrustPolicy(named=("acme",))),
])
def test_every_public_form_reads_as_one_policy(setting, policy: TrustPolicy) -> None:
    assert trust_policy(setting) == policy


@pytest.mark.parametrize("setting", [["../x"], ["a/b/c"], [5], 3.5, ["-rf"],
                                     {"acme": False}, {"acme": True}, {"acme/ragged": 1}, {}.keys(), b"acme", 1])
def test_bad_trust_settings_are_refused(setting) -> None:
    with pytest.raises(TrustError, match="trust_remote_code"):
        trust_policy(setting)


def test_a_mapping_never_trusts_its_keys() -> None:
    """{"acme": False} reads as 'do not trust acme' to a person; iterating it would trust acme: one clear error."""
    with pytest.raises(TrustError, match="not dict"):
        trust_policy({"acme": False})


def test_env_adds_trusted_orgs(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TrustError):
        check_trust(HUB, NOTHING_EXTRA)
    monkeypatch.setenv("KERNEL_HUB_TRUSTED_ORGS", "other, acme")
    check_trust(HUB, NOTHING_EXTRA)


def test_the_error_names_a_flag_every_loading_command_has(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(TrustError) as exc:
        check_trust(HUB, NOTHING_EXTRA, asked_for="kernel-hub/alias")
    message = str(exc.value)
    assert "acme/ragged" in message and "registry alias kernel-hub/alias" in message and "\n" not in message
    flag = "--trust-remote-code"
    assert flag in message
    parser = cli.build_parser()
    for command in ("validate", "lock"):
        bare = parser.parse_args([command, "acme/ragged", flag])
        assert cli._trust(bare.trust_remote_code) is True
        listed = parser.parse_args([command, "acme/ragged", f"{flag}=acme,kernel-hub/x"])
        assert cli._trust(listed.trust_remote_code) == ["acme", "kernel-hub/x"]
        assert cli._trust(parser.parse_args([command, "acme/ragged"]).trust_remote_code) is False


def _edges(tmp_path):
    import kernel_hub as kh
    from kernel_hub.load.hf_lock import lock_project

    missing = str(tmp_path / "missing")
    return {
        "get_kernel": lambda t: kh.get_kernel("acme/none", version=1, trust_remote_code=t),
        "plan_load": lambda t: kh.plan_load("acme/none", version=1, trust_remote_code=t),
        "lock": lambda t: kh.lock(["acme/none"], path=tmp_path / "k.lock", trust_remote_code=t),
        "get_locked_kernel": lambda t: kh.get_locked_kernel("acme/none", lockfile=missing, trust_remote_code=t),
        "lock_project": lambda t: lock_project(missing, trust_remote_code=t),
        "kernelize": lambda t: kh.kernelize(object(), trust_remote_code=t),
        "validate": lambda t: kh.validate("acme/none", trust_remote_code=t),
    }


@pytest.mark.parametrize("edge", ["get_kernel", "plan_load", "lock", "get_locked_kernel", "lock_project", "kernelize",
                                  "validate"])
def test_every_public_edge_refuses_a_malformed_setting_before_any_work(edge: str, tmp_path) -> None:
    """Each edge reads the setting first: the error is the setting's, not the missing repo, file or model's."""
    with pytest.raises(TrustError, match="trust_remote_code must be True/False or a list"):
        _edges(tmp_path)[edge](3.5)
    assert not (tmp_path / "k.lock").exists()
