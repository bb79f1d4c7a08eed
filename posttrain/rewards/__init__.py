"""The reward stack: terms composed on a verifier's result, KL controllers, Bradley–Terry
reward models, and the proxy reward that trains on one while the verifier watches."""
