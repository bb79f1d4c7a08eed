"""The six roles of an RL post-training system, one module each (ARCHITECTURE.md, "Bird's-eye view")."""
