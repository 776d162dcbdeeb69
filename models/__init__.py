"""Models: the bundled tiny pair, and code that makes the models tests and benchmarks need."""
