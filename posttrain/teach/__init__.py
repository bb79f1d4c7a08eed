"""The curriculum's tools: the lesson launcher, widget helpers the notebooks share, the
exercise checker and the demos."""
