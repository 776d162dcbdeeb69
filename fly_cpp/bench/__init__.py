"""``fly-cpp bench``: speed and fidelity of the decoding modes, side by side.

datasets (prompts) -> modes (named SpecSettings, or llama.cpp's binaries via peer) -> runner
(interleaved timed runs, then fidelity and checkers) -> summary (per-mode rows) -> report
(results.json, summary.md, plots). ``suite.run_benchmark`` ties them together.
"""
