"""Shared pytest setup: puts tests/ on sys.path so test folders can share `*_testlib` helpers."""
