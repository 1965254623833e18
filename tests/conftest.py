"""Shared fixtures: the built-in targets come from commitstore's own pytest plugin."""

pytest_plugins = ["commitstore.testing.plugin"]
