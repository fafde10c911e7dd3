"""Shared base of clarion: settings, errors, clock and fault points. Imports nothing of ours."""
