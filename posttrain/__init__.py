"""posttrain: RL post-training for language models, from first principles."""

__version__ = "0.1.0"
