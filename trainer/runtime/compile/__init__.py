"""Compile caches and progress: where they live, portable artifacts, what is compiling now."""
