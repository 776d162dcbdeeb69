"""Basics every room may use: errors, code fences, integer bounds, the JSON cache files."""
