"""Developer tools for pedsl (not shipped in the wheel): run them as ``python -m tools.<name>``."""
