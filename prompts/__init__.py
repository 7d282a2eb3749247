"""Planner prompt templates (versioned text files), shipped as package data so an
installed wheel finds them too; see README.md in this folder."""
