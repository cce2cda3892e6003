"""config.yaml is written with libyaml's emitter where PyYAML has it: the same text as the pure-Python one."""

from __future__ import annotations

import yaml

from common.typed import to_plain
from launcher.config.compose import compose
from launcher.jobs.rundir import config_yaml


def test_config_yaml_is_the_text_pure_pyyaml_writes():
    cfg = to_plain(compose(["training=llama31/8b", "cluster=bcm"]))
    cfg["notes"] = {
        "unicode": "naïve café 東京 🙂",
        "long": "word " * 60,
        "multi": "a\nb\n",
        "none": None,
        "tiny": 1e-12,
        "quoted": "yes",
        "list": [1, "2", 3.0],
    }
    text = config_yaml(cfg)
    assert text == yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False)
    assert yaml.safe_load(text) == cfg
