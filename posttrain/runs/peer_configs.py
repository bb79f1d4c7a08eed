"""`posttrain export-config --to trl|openrlhf|verl`: a run's settings carried to a peer
framework, as the configuration it reads (TRL's config keywords, OpenRLHF's command line,
verl's Hydra overrides), so that a run tuned here on a laptop can be repeated there at scale.

    export_config(cfg, algo_fields, "verl")   a PeerConfig: settings, text, unmapped, notes

A setting with no counterpart in the peer is listed (PeerConfig.unmapped, and a comment atop
the text), never dropped unseen; a value the peer cannot express (an algorithm it lacks, a
loss aggregation it has no switch for) is refused with a ConfigError that names the setting
and the change that makes it expressible. The mappings are one module per peer
(peer_trl, peer_openrlhf, peer_verl); each names the version its tests check it against.
"""

from __future__ import annotations

from typing import Any, Callable

from posttrain.config import ConfigError, TrainConfig
from posttrain.runs.peer_openrlhf import to_openrlhf
from posttrain.runs.peer_settings import PeerConfig, RunSettings
from posttrain.runs.peer_trl import to_trl
from posttrain.runs.peer_verl import to_verl

PEERS: dict[str, Callable[[TrainConfig, RunSettings], PeerConfig]] = {
    "trl": to_trl, "openrlhf": to_openrlhf, "verl": to_verl}


def export_config(cfg: TrainConfig, algo_fields: dict[str, Any], peer: str) -> PeerConfig:
    """`cfg` as `peer`'s configuration. algo_fields: rl.algo's hyperparameters, resolved (its
    defaults with rl.algo_params on top, as the run builds the algorithm)."""
    if peer not in PEERS:
        raise ConfigError(f"--to={peer!r}: expected one of {', '.join(PEERS)}")
    if cfg.stages:
        raise ConfigError(f"stages={cfg.stages!r} cannot be exported: a peer config holds one RL stage; export "
                          "each stage's config (its rl.algo and settings) on its own")
    return PEERS[peer](cfg, RunSettings(cfg, algo_fields, peer))
