"""The drafters: the seam the round calls (``seam``: Draft, Report, a caller's drafter), the pair's
one drafter (``drafter``: n-gram lookup chained with a stepper, at a fixed k or as k auto's pacer
plans), the one step loop and its ``Stepper`` (``steps``), the steppers (the draft model with its
native runs, ``draft_model``; the target's MTP head, ``mtp``) and n-gram lookup (``ngram``)."""
