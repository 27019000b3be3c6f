"""Frontends' protocols the relay speaks, each a view over the same runs and event log."""
