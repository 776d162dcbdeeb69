"""Slots drafting together (``fly_cpp.engine.batchloop.Rounds``) under k auto: ``worth.together``
prices a round drafted for every slot at once against the slots decoding one row each."""

from __future__ import annotations

from fly_cpp.kauto import worth
from fly_cpp.kauto.costs import Costs, Curve

MS = 1e-3

# the F16 Qwen pair as calibrated on the 2-core CPU (target and draft, seconds by rows)
CPU = Costs(Curve((1, 2, 4, 8, 12, 17), (89 * MS, 129 * MS, 153 * MS, 229 * MS, 267 * MS, 328 * MS)),
            Curve((1, 2, 4, 8, 16), (16 * MS, 40 * MS, 55 * MS, 71 * MS, 88 * MS)))
# a GPU-like target: a batch of 20 rows costs little more than one row; the draft a tenth of it
FLAT = Costs(Curve((1, 4, 16, 32), (10 * MS, 10.5 * MS, 11 * MS, 13 * MS)),
             Curve((1, 4, 16), (1 * MS, 1.1 * MS, 1.3 * MS)))


def test_where_batches_cost_little_more_than_a_row_slots_draft_together():
    assert worth.together(FLAT, 0.7, 4, 3) == 3
    assert worth.together(FLAT, 0.7, 2, 5) >= 3


def test_where_rows_cost_about_what_they_add_they_do_not():
    # drafting together ran 0.84-0.94x drafting nothing here (docs/slots.md), priced at up to 1.2x
    for slots in (2, 3, 4):
        for accept in (0.6, 0.75, 0.9):
            assert worth.together(CPU, accept, slots, 3) == 0


def test_nothing_accepted_never_drafts():
    assert worth.together(FLAT, 0.0, 4, 3) == 0
