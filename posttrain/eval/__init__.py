"""Measurement (Loop A): held-out pass@1 with a bootstrap CI, completions files scored and
compared, the shipped packs and their statistics."""
