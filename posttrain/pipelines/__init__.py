"""The jobs: a config turned into objects once (build.py), then the stages that train and
measure (sft, rl, preference), the whole run, RLHF and side-by-side comparisons."""
