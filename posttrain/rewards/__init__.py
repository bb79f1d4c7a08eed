"""The reward stack: terms composed on a verifier's result, KL controllers, Bradley–Terry
reward models, the proxy reward that trains on one while the verifier watches, and rubric
rewards (rubric.py: weighted criteria with reasons; judge.py: a local model as the judge,
read as a soft label)."""
