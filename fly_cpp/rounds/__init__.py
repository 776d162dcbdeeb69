"""The round: a generation's loop (``loop``: draft, one target decode, verify, keep, report), its
request, verification and accept rule, output and text, the target-only runs, cross-round windows,
context shifts, prefill and scoring."""
