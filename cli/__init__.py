"""The ``fly-cpp`` command line."""
