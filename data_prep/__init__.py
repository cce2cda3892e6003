"""Data preparation: raw corpora (The Pile, C4, local files) -> megatron-core .bin/.idx files.

`data_prep.shards` (standard library only) says which shards a config describes; `python -m data_prep run`
prepares them. See docs/data-preparation.md.
"""
