"""A fixture for tests/test_typed_config.py, never imported: a misspelt config attribute that the type checker must
refuse (`seq_lenght`)."""

from common.config import Config


def tokens_per_step(cfg: Config) -> int:
    return cfg.training.global_batch_size * cfg.training.seq_lenght
