"""Test-time compute: spend more samples at inference and select among them (Loop B)."""
