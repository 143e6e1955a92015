"""Helpers shared by test folders (importable as `helpers.NAME`: tests/ is on sys.path)."""
