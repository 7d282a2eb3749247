"""Roost."""
