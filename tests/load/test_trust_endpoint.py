"""The default trusted organisations hold at the default endpoint only: at a mirror (any other HF_ENDPOINT) whoever
holds its write token would choose the code every pod runs, so trust there is explicit, and the refusal names the
variable and the flag that give it."""

from __future__ import annotations

import pytest

from kernel_hub.errors import TrustError
from kernel_hub.load.trust import (
    NOTHING_EXTRA,
    TRUST_ENV,
    check_trust,
    default_orgs_for,
    trust_decision,
    trust_policy,
    trusted_orgs,
)
from kernel_hub.sources.base import Origin

MIRROR = "https://hub-mirror.example.internal"


def test_default_orgs_are_trusted_at_huggingface_co_only() -> None:
    assert default_orgs_for(Origin("hub", "kernel-hub/ragged-dot-tpu", "https://huggingface.co/")) != ()
    assert default_orgs_for(Origin("hub", "kernel-hub/ragged-dot-tpu", MIRROR)) == ()
    assert default_orgs_for(Origin("hub", "kernel-hub/ragged-dot-tpu", "http://127.0.0.1:8080")) == ()


def test_a_mirror_of_a_default_org_needs_explicit_trust(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRUST_ENV, raising=False)
    mirror = Origin("hub", "kernel-hub/ragged-dot-tpu", MIRROR)
    check_trust(Origin("hub", "kernel-hub/ragged-dot-tpu", "https://huggingface.co"), NOTHING_EXTRA)  # no error
    with pytest.raises(TrustError) as refused:
        check_trust(mirror, NOTHING_EXTRA)
    message = str(refused.value)
    assert MIRROR in message and f"{TRUST_ENV}=kernel-hub" in message and "--trust-remote-code" in message
    assert "only at https://huggingface.co" in message
    monkeypatch.setenv(TRUST_ENV, "kernel-hub")
    check_trust(mirror, NOTHING_EXTRA)  # trusted explicitly
    assert trust_decision(mirror, trust_policy(["kernel-hub"]), trusted_orgs(Origin("hub", "x/y", MIRROR)))[0]


def test_local_folders_keep_their_trust() -> None:
    assert trust_decision(Origin("local", "kernel-hub/toy", "/src/toy"), NOTHING_EXTRA, ())[0]
