"""Plan.fetch is the one way from a plan to a build that is imported or locked, and only a plan whose origin passed
a trust policy gets one: get_kernel's load_plan, lock, the TPU compile gate, and a plan made without a check. An
untrusted repo is refused before a single file is fetched; a plan checked against a policy is not checked again
for that policy. Below the public edge every loading function takes the TrustPolicy, never the raw setting."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from kernel_hub import api
from kernel_hub.decide.system import SystemFacts
from kernel_hub.decide.variants import Variant
from kernel_hub.decide.versions import Ref
from kernel_hub.errors import NoVariantError, TrustError
from kernel_hub.load import lock, pipeline, planning
from kernel_hub.load.lock import lock_one
from kernel_hub.load.planning import plan_load
from kernel_hub.load.trust import NOTHING_EXTRA, TrustPolicy, trust_policy
from kernel_hub.sources.base import Build, Origin
from kernel_hub.tpu.compile_gate import gate

COMMIT = "ab" * 20
REPO = "acme/ragged"  # an organisation outside the trusted ones


class FakeHub:
    """A Hub repo of an untrusted organisation, in memory: one release v1.2.0 with jax-cpu and jax-tpu builds
    that name no version (the plan's resolution fills it in). Counts fetches."""

    def __init__(self, tmp: Path, variants: tuple[str, ...] = ("jax-cpu", "jax-tpu")) -> None:
        self.tmp, self.names, self.fetched = tmp, variants, []

    def refs(self, repo_id: str) -> list[Ref]:
        return [Ref("v1.2.0", "tag", COMMIT), Ref("v1", "branch", COMMIT)]

    def origin(self, repo_id: str) -> Origin:
        return Origin("hub", repo_id, "http://127.0.0.1:9")

    def candidate_variants(self, repo_id: str, commit: str, names: list[str]) -> list[Variant]:
        return [Variant(n, "jax", n.split("-")[1]) for n in self.names]

    def fetch(self, repo_id: str, commit: str, variant: Variant) -> Build:
        self.fetched.append(variant.name)
        package = self.tmp / variant.name / "pkg"
        package.mkdir(parents=True, exist_ok=True)
        return Build(repo_id, None, commit, variant, package, "fake")

    def describe(self) -> str:
        return "fake hub"


CPU = SystemFacts(backend="cpu")
ACME = trust_policy([REPO])


def _plan(hub: FakeHub, trust: TrustPolicy | None = None, system: SystemFacts = CPU) -> planning.Plan:
    return plan_load(REPO, version=1, framework="jax", system=system, source=hub, trust=trust)


def test_a_plan_made_without_a_check_is_checked_before_import(tmp_path: Path) -> None:
    hub = FakeHub(tmp_path)
    plan = _plan(hub)  # resolve/download-style planning: no trust asked
    with pytest.raises(TrustError, match="without a trust policy"):
        plan.fetch()
    with pytest.raises(TrustError, match=REPO):
        api.load_plan(plan, trust_remote_code=False)
    with pytest.raises(TrustError):
        plan.trusted(trust_policy(["other/repo"]))
    assert hub.fetched == []
    build = plan.trusted(ACME).fetch()
    assert hub.fetched == ["jax-cpu"] and build.version == "1.2.0"  # the resolution's version, filled in


def test_a_fetch_that_imports_nothing_needs_no_trust(tmp_path: Path) -> None:
    hub = FakeHub(tmp_path)
    assert _plan(hub).chosen_variant().name == "jax-cpu" and hub.fetched == []
    assert _plan(hub).download().variant.name == "jax-cpu"


def test_no_fit_is_raised_before_any_trust_or_fetch(tmp_path: Path) -> None:
    hub = FakeHub(tmp_path, variants=("jax-tpu",))
    with pytest.raises(NoVariantError, match="fits this system"):
        _plan(hub).chosen_variant()
    with pytest.raises(NoVariantError):
        _plan(hub).fetch()
    with pytest.raises(NoVariantError):
        _plan(hub).download()
    with pytest.raises(NoVariantError):
        api.load_plan(_plan(hub), trust_remote_code=False)
    assert hub.fetched == []


def test_get_kernel_path_refuses_before_fetching(tmp_path: Path) -> None:
    hub = FakeHub(tmp_path)
    with pytest.raises(TrustError):
        _plan(hub, trust=NOTHING_EXTRA)  # plan_load: refused before any variant is listed
    plan = _plan(hub)
    with pytest.raises(TrustError):
        api.load_plan(plan, trust_remote_code=False)
    with pytest.raises(TrustError):
        api.load_plan(plan, trust_remote_code=None)  # None at load_plan trusts nothing extra
    with pytest.raises(TrustError):
        pipeline.load_plan(plan)  # below the edge: a plan made without a policy is not imported
    assert hub.fetched == []


def test_a_policy_plan_load_checked_is_checked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    real = planning.check_trust

    def counting(origin, policy, asked_for=None):
        calls.append(policy)
        return real(origin, policy, asked_for=asked_for)

    monkeypatch.setattr(planning, "check_trust", counting)
    hub = FakeHub(tmp_path)
    plan = _plan(hub, trust=ACME)
    assert plan.trust == ACME
    plan.trusted(trust_policy([REPO])).fetch()  # an equal policy built again: no second check
    assert calls == [ACME] and hub.fetched == ["jax-cpu"]
    with pytest.raises(TrustError):  # another policy than the one checked: checked again, and refused
        plan.trusted(NOTHING_EXTRA)
    assert len(calls) == 2 and hub.fetched == ["jax-cpu"]


def test_lock_refuses_an_untrusted_repo_before_fetching(tmp_path: Path) -> None:
    hub = FakeHub(tmp_path)
    with pytest.raises(TrustError):
        lock_one(REPO, version=1, backend="cpu", source=hub, trust=NOTHING_EXTRA)
    with pytest.raises(TrustError):
        lock.lock([REPO], version=1, backend="cpu", source=hub, trust_remote_code=None, path=tmp_path / "k.lock")
    assert hub.fetched == [] and not (tmp_path / "k.lock").exists()
    locked = lock_one(REPO, version=1, backend="cpu", source=hub, trust=trust_policy(["acme"]))
    assert locked.version == "1.2.0" and locked.commit == COMMIT and hub.fetched == ["jax-cpu"]


def test_tpu_gate_refuses_an_untrusted_repo_before_fetching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = FakeHub(tmp_path)

    def plan_from_fake(repo_id, **kwargs):
        kwargs.pop("revision", None)
        return plan_load(repo_id, version=1, source=hub, **kwargs)

    monkeypatch.setattr(gate, "plan_load", plan_from_fake)
    with pytest.raises(TrustError):
        gate.repo_package(REPO, NOTHING_EXTRA)
    assert hub.fetched == []
    target = gate.repo_package(REPO, TrustPolicy(named=(REPO,)))
    assert hub.fetched == ["jax-tpu"] and target.variant == "jax-tpu" and target.version == "1.2.0"


def test_tpu_gate_no_fit_is_the_plans_decision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = FakeHub(tmp_path, variants=("jax-cpu",))

    def plan_from_fake(repo_id, **kwargs):
        kwargs.pop("revision", None)
        return plan_load(repo_id, version=1, source=hub, **kwargs)

    monkeypatch.setattr(gate, "plan_load", plan_from_fake)
    with pytest.raises(NoVariantError, match="nothing to compile for a TPU: no build of acme/ragged@1.2.0 fits") as got:
        gate.repo_package(REPO, ACME)
    assert "jax-cpu" in str(got.value) and hub.fetched == []


@pytest.mark.parametrize("function", [planning.plan_load, pipeline.load_plan, lock.lock_one, lock.load_locked,
                                      gate.repo_package])
def test_below_the_edge_trust_is_a_policy(function) -> None:
    params = inspect.signature(function).parameters
    assert "trust_remote_code" not in params
    assert "trust" not in params or params["trust"].annotation in ("TrustPolicy", "TrustPolicy | None")
