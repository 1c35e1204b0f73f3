"""Is a release signed? HF kernels' convention: `build/<variant>/metadata.json.sigstore`, a Sigstore bundle over the
variant's metadata.json (which lists every file's sha256, so a valid signature covers the whole build).

`kernel-hub info` shows, per variant, one of:
  not signed      no metadata.json.sigstore (every kernel-hub release: see NOT_SIGNED_WHY)
  verified        the bundle verifies offline against the trust root the sigstore package ships (certificate
                  chain to Fulcio's root, the transparency log's signed inclusion proof inside the bundle, the
                  signature over metadata.json's bytes); the signing identity is shown, not judged: HF kernels'
                  `verify-signature` checks it against HF's CI workflows, and ours are not among them
  invalid         the bundle is there and does not verify (the reason)
  unverifiable    the bundle is there and the sigstore package is not installed here
The decision (`signature_status`) is pure: the bytes and a verifier go in, the status and its reason come out.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SIGNATURE_FILE = "metadata.json.sigstore"
MAX_SIGNATURE_BYTES = 1 << 20
NOT_SIGNED_WHY = ("kernel-hub publish does not sign: signing needs a Sigstore identity (an OIDC token, e.g. a CI "
                  "workflow's) certified by Fulcio and an entry in the Rekor transparency log, none of which this "
                  "publisher holds or can reach")

#: (bundle bytes, metadata.json bytes) -> the signer's identity; raises on anything that does not verify.
Verifier = Callable[[bytes, bytes], str]


@dataclass(frozen=True)
class SignatureStatus:
    state: str        # "not signed", "verified", "invalid", "unverifiable"
    reason: str
    identity: str | None = None

    def line(self) -> str:
        return f"{self.state}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "identity": self.identity}


def sigstore_verifier() -> Verifier | None:
    """Offline verification with the sigstore package (its bundled production trust root), or None where it is
    not installed. The policy accepts any identity: the status reports it rather than deciding whom to trust."""
    if importlib.util.find_spec("sigstore") is None:
        return None

    def verify(bundle: bytes, metadata: bytes) -> str:
        from sigstore.models import Bundle
        from sigstore.verify import Verifier as SigstoreVerifier
        from sigstore.verify.policy import UnsafeNoOp

        parsed = Bundle.from_json(bundle)
        SigstoreVerifier.production(offline=True).verify_artifact(metadata, parsed, UnsafeNoOp())
        cert = parsed.signing_certificate
        from cryptography.x509 import SubjectAlternativeName

        try:
            san = cert.extensions.get_extension_for_class(SubjectAlternativeName).value
            names = [str(getattr(n, "value", n)) for n in san]
        except Exception:  # a certificate without a SAN: say so rather than fail the status
            names = []
        return ", ".join(names) or "(no subject alternative name)"

    return verify


def signature_status(bundle: bytes | None, metadata: bytes | None, verifier: Verifier | None) -> SignatureStatus:
    """The signing status of one variant from its bundle's and metadata.json's bytes (None: absent)."""
    if bundle is None:
        return SignatureStatus("not signed", f"no {SIGNATURE_FILE}; {NOT_SIGNED_WHY}")
    if metadata is None:
        return SignatureStatus("invalid", f"{SIGNATURE_FILE} is there but metadata.json, what it signs, is not")
    if len(bundle) > MAX_SIGNATURE_BYTES:
        return SignatureStatus("invalid", f"{SIGNATURE_FILE} is over {MAX_SIGNATURE_BYTES >> 20} MiB")
    if verifier is None:
        return SignatureStatus("unverifiable", f"{SIGNATURE_FILE} is there; unverifiable here: the sigstore package "
                                               "is not installed (pip install 'kernels[sigstore]')")
    try:
        identity = verifier(bundle, metadata)
    except Exception as exc:  # any refusal by the verifier is the answer, with its first line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return SignatureStatus("invalid", f"{SIGNATURE_FILE} does not verify against metadata.json: {first}")
    return SignatureStatus("verified", "verified offline against sigstore's bundled trust root; signed by "
                                       f"{identity} (identity shown, not checked against a policy)", identity)
