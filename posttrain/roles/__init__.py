"""The six roles of an RL post-training system, one module each (see README)."""
