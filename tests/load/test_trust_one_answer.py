"""One server, one trust answer: HF `kernels` (which asks the server whether an org is a trusted publisher) and
kernel-hub (which never asks) load or refuse the same repo from the same loopback `kernel-hub serve` for every
trust_remote_code form both accept, with the server run plainly and with KERNEL_HUB_TRUSTED_ORGS set for both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("kernels")
pytest.importorskip("torch")
hf = pytest.importorskip("huggingface_hub")

from huggingface_hub import HfApi  # noqa: E402

from kernel_hub.cli.serve import reported_trusted_orgs  # noqa: E402
from kernel_hub.errors import TrustError  # noqa: E402
from kernel_hub.load.trust import TRUST_ENV  # noqa: E402
from tests.hub_server import hf_kernels_toy, hub_env, running_server  # noqa: E402

TOKEN = "trust-token"
REPO = "acme/relu"

# Both clients in one fresh process (each reads HF_ENDPOINT at import): per trust setting, whether each loaded the
# repo, and for a refusal the error's type and text (a refusal must be the trust check, not some other failure).
_BOTH = """
import json, torch, kernels, kernel_hub as kh
rows = {}
for name, setting in (("false", False), ("true", True), ("repo", [REPO])):
    row = {}
    for client in ("hf", "ours"):
        try:
            if client == "hf":
                m = kernels.get_kernel(REPO, version=1, trust_remote_code=setting)
            else:
                m = kh.get_kernel(REPO, version=1, framework="torch", backend="cpu", trust_remote_code=setting)
            row[client] = {"loaded": m.relu(torch.tensor([-1.0, 2.0])).tolist() == [0.0, 2.0]}
        except Exception as exc:
            row[client] = {"loaded": False, "error": type(exc).__name__, "message": str(exc)}
    rows[name] = row
print(json.dumps(rows))
"""


def _publish_toy(server, root: Path) -> None:
    api = HfApi(endpoint=server.url, token=TOKEN)
    api.create_repo(REPO, repo_type="kernel")
    commit = api.upload_folder(repo_id=REPO, repo_type="kernel", folder_path=hf_kernels_toy(root / "toy")).oid
    api.create_branch(REPO, branch="v1", revision=commit, repo_type="kernel")


def _both_clients(server, cache: Path, **env: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", f"REPO = {REPO!r}\n" + _BOTH], env=hub_env(server, cache, **env),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _assert_refused_for_trust(row: dict) -> None:
    assert row["hf"]["error"] == "ValueError" and "trusted publisher" in row["hf"]["message"], row
    assert row["ours"]["error"] == "TrustError" and TRUST_ENV in row["ours"]["message"], row


@pytest.mark.parametrize("org_env", [None, "acme"], ids=["plain-serve", "trusted-orgs-env"])
def test_both_clients_reach_one_decision_per_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    org_env: str | None) -> None:
    """Plain serve: both refuse without trust and load with True or the repo named. KERNEL_HUB_TRUSTED_ORGS=acme
    where serve runs and where the clients run (one machine, one shell): both load with no flag."""
    monkeypatch.delenv(TRUST_ENV, raising=False)
    if org_env:
        monkeypatch.setenv(TRUST_ENV, org_env)  # the server process inherits it
    with running_server(tmp_path / "store", token=TOKEN) as server:
        _publish_toy(server, tmp_path)
        rows = _both_clients(server, tmp_path / "cache", **({TRUST_ENV: org_env} if org_env else {}))
        asked = [p for _, p, _ in server.requests()]
    assert "/api/organizations/acme/overview" in asked  # HF kernels asked the server; the answer decided for it
    for name, row in rows.items():
        assert row["hf"]["loaded"] == row["ours"]["loaded"], (name, row)
    if org_env:
        assert all(row["hf"]["loaded"] for row in rows.values()), rows
    else:
        _assert_refused_for_trust(rows["false"])
        assert rows["true"]["hf"]["loaded"] and rows["repo"]["hf"]["loaded"], rows


def test_serve_reports_the_trusted_orgs_env_unless_the_flag_names_others(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRUST_ENV, raising=False)
    assert reported_trusted_orgs(None) == ()  # no blanket trust for every org in the store
    monkeypatch.setenv(TRUST_ENV, "acme, kernel-hub")
    assert reported_trusted_orgs(None) == ("acme", "kernel-hub")
    assert reported_trusted_orgs(["other"]) == ("other",)
    monkeypatch.setenv(TRUST_ENV, "acme,../etc")
    with pytest.raises(TrustError, match=TRUST_ENV):
        reported_trusted_orgs(None)
    with pytest.raises(TrustError, match="--trusted-org"):
        reported_trusted_orgs(["bad org"])
