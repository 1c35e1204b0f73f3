"""Version resolution is a pure function over a repo's refs."""

import hashlib

import pytest

from kernel_hub.decide.versions import Ref, parse_spec, resolve
from kernel_hub.errors import VersionSpecError

C = {n: hashlib.sha1(str(n).encode()).hexdigest() for n in range(1, 10)}
REFS = [
    Ref("v1.0.0", "tag", C[1]),
    Ref("v1.2.0", "tag", C[2]),
    Ref("v1.3.1", "tag", C[3]),
    Ref("v2.0.0", "tag", C[4]),
    Ref("v1", "branch", C[3]),
    Ref("v2", "branch", C[5]),
    Ref("main", "branch", C[5]),
    Ref("nightly", "tag", C[6]),
]


def test_int_is_major_branch():
    r = resolve(REFS, version=1)
    assert (r.commit, r.ref, r.version) == (C[3], "v1", "1.3.1")
    r2 = resolve(REFS, version=2)
    assert r2.commit == C[5] and r2.version is None  # branch moved past its last tag


@pytest.mark.parametrize(
    ("spec", "commit"),
    [(">=1.2,<2", C[3]), ("~=1.2.0", C[2]), ("<1.2", C[1]), (">=1", C[4]), ("1.2.0", C[2]), ("v1.0.0", C[1])],
)
def test_spec_picks_highest_matching_tag(spec, commit):
    assert resolve(REFS, version=spec).commit == commit


def test_revision_by_tag_branch_and_commit():
    assert resolve(REFS, revision="main").commit == C[5]
    assert resolve(REFS, revision="v1.2.0").version == "1.2.0"
    assert resolve(REFS, revision=C[4][:10]).version == "2.0.0"
    unknown = "ab" * 20
    assert resolve(REFS, revision=unknown).commit == unknown


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"version": ">=3"}, "no release matches"),
        ({"version": 7}, "no branch v7"),
        ({"version": "not a spec!"}, "not a PEP 440 specifier"),
        ({"version": 1, "revision": "main"}, "not both"),
        ({}, "no version given"),
        ({"revision": "nope"}, "no ref or commit"),
        ({"version": 1.5}, "must be an int or a string"),
    ],
)
def test_bad_requests_name_the_fix(kwargs, message):
    with pytest.raises(VersionSpecError, match=message):
        resolve(REFS, **kwargs)


def test_parse_spec_rejects_garbage():
    with pytest.raises(VersionSpecError):
        parse_spec(">=1.0,,<")


@pytest.mark.parametrize("version", [10**5000, 10**7, ">=" + "9" * 5000, "==1." + "9" * 5000, ">=1," * 100],
                         ids=["int-5000-digits", "int-8-digits", "spec-5000-digits", "exact-5000-digits", "long-spec"])
def test_a_huge_version_is_one_error_not_a_value_error(version) -> None:
    """Python refuses to print or read integers of thousands of digits: refused before either happens."""
    with pytest.raises(VersionSpecError) as refused:
        resolve(REFS, version=version)
    assert len(str(refused.value)) < 300
