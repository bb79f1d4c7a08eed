"""Data: preference pairs (read, written, built from a verifier's verdicts) and the packs
shipped in data/packs/."""
