"""Backends built into the core: generic defaults for any torch device, and the CPU backend."""
