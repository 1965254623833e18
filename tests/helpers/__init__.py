"""Helpers shared by the tests (child processes, mounts)."""
