"""The engine: loading a pair (``loading``), admitting requests (``admit``), the control face
that gives each request its drafter and k auto's pacer (``control``), the step loop and its slots
(``scheduler``, ``batchloop``, ``ledger``), the generations handed back (``generation``)."""
