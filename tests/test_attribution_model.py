"""The attribution vocabulary shared by agent and operator (netval.model.attribution)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from netval.model.attribution import (
    Attribution,
    ErrorsKey,
    Evidence,
    attribution_of,
    evidence_of,
)
from netval.model.ids import CheckId


def test_every_evidence_is_a_check_id() -> None:
    ids = {c.value for c in CheckId}
    assert {e.value for e in Evidence} <= ids


def test_contract_values() -> None:
    # The operator side of issue 28 matches on these strings: they never change.
    assert Attribution.REQUESTER == "requester"
    assert Attribution.LOCAL == "local"
    assert ErrorsKey.ATTRIBUTION == "attribution"
    assert ErrorsKey.COUNTERS == "counters"
    assert ErrorsKey.RATE_PER_SECOND == "ratePerSecond"
    assert ErrorsKey.EVIDENCE == "evidence"


def test_reads_what_an_agent_wrote() -> None:
    observed = {"attribution": "local", "evidence": ["link.flaps", "pfc.discards"]}
    assert attribution_of(observed) is Attribution.LOCAL
    assert evidence_of(observed) == (Evidence.LINK_FLAPS, Evidence.PFC_DISCARDS)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)


@given(st.dictionaries(st.sampled_from(["attribution", "evidence", "x"]), json_values))
def test_untrusted_observed_never_raises(observed: dict[str, object]) -> None:
    found = attribution_of(observed)
    assert found is None or isinstance(found, Attribution)
    assert all(isinstance(e, Evidence) for e in evidence_of(observed))
