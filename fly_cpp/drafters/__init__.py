"""The drafters: the seam the round calls (``seam``: Draft, Report, the n-gram drafter), the draft
model's steps and native runs (``draft_model``), n-gram lookup (``ngram``), the MTP head (``mtp``),
and k auto's paced drafter (``paced``), which drafts what the pacer plans."""
