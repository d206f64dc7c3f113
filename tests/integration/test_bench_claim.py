"""The bench's claim section (bench/claim.py) on a real server: both claims take every
occurrence, the CPU figures are measured, and the store's functions are put back."""

from __future__ import annotations

from bench import claim
from cronwell import dispatch
from cronwell.store import claims
from cronwell.store.db import Database


async def test_the_claim_section_claims_every_occurrence_both_ways(db: Database) -> None:
    before = {name: getattr(mod, name) for mod, name in claim.STEPS}
    figs = await claim.claim_cpu(db, 1_500, 3)
    assert (figs["claimed"], figs["bare_claimed"]) == (1_500, 1_500)
    assert figs["claim_cpu_ms_per_occurrence"] > 0
    assert figs["bare_claim_cpu_ms_per_occurrence"] > 0
    assert figs["steps_cpu_ms_per_occurrence"]["start"] > 0
    assert set(figs["steps_cpu_ms_per_occurrence"]) <= {name for _, name in claim.STEPS}
    assert claims.start is before["start"] and dispatch.decide is before["decide"]
