"""`posttrain export-config --to trl|openrlhf|verl`: a training command's settings (its flags,
or `--config runs/<id>/config.json`) as a peer framework's configuration, printed: a TRL
config snippet, an OpenRLHF command line or verl's Hydra overrides, with a comment listing
every setting that has no counterpart there (posttrain/runs/peer_configs.py). It reads the
settings exactly as `posttrain train` does, and checks their values, but loads no model and
no data: nothing is trained.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Literal

import tyro

from posttrain.cli.train_flags import parse_train, section_defaults
from posttrain.config import TrainConfig

SUMMARY = ("a run's settings as a peer framework's configuration: TRL's config keywords, OpenRLHF's "
           "train_ppo_ray command or verl's Hydra overrides, with every setting that has no counterpart listed "
           "(read as `posttrain train` reads them: flags, or --config runs/<id>/config.json)")


def cmd_export_config(argv: list[str]) -> int:
    extra = [("to", Annotated[Literal["trl", "openrlhf", "verl"], tyro.conf.arg(
                  help="the peer to write for: trl (GRPOConfig, RLOOConfig or DPOConfig), openrlhf "
                       "(python -m openrlhf.cli.train_ppo_ray) or verl (python -m verl.trainer.main_ppo)")],
              dataclasses.MISSING),
             ("format", Annotated[Literal["text", "json"], tyro.conf.arg(
                  help="text: the snippet or command, the unmapped settings as comments above it; json: "
                       "peer, settings, unmapped, notes and text as one object, for a script")], "text")]
    parsed = parse_train(argv, "posttrain export-config", SUMMARY, TrainConfig(), extra)
    cfg = parsed.with_algo_params(parsed.cfg, {parsed.cfg.rl.algo})
    # imported here for start-up time: runs/ is the library band, and the flags above are answered without it
    from posttrain.runs.peer_configs import export_config

    algorithm = section_defaults(cfg.rl)[cfg.rl.algo]  # its class checks the ranges of rl.algo_params
    peer = export_config(cfg, dataclasses.asdict(algorithm), parsed.args.to)
    if parsed.args.format == "json":
        print(json.dumps(dataclasses.asdict(peer), indent=2))
    else:
        print(peer.text, end="")
    return 0
