"""Downloads from the Hugging Face hub: a repository's files into the Hugging Face cache or a directory, with
HF_TOKEN for gated repositories; a failure is one line saying why and what to do. No torch here: setup.sh fetches
the tokenizer and the weights with this module's command on login nodes, and the import (init_from_hf, and its
`python -m recipes.hf.importer fetch`) and the export's tokenizer download through the same function.

    python -m recipes.hf.hub fetch meta-llama/Llama-3.1-8B --local-dir /shared/models/Llama-3.1-8B
    python -m recipes.hf.hub fetch meta-llama/Llama-3.1-8B --tokenizer --local-dir tokenizers/Llama-3.1-8B
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from common.hf_config import KEY

# What a run (and an export) needs of a model repository: weights, index, configs, tokenizer.
MODEL_FILES = ("*.safetensors", "*.json", "tokenizer.model")
# The tokenizer alone, with the configs that name its special tokens.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
    "generation_config.json",
)
OFFLINE_FIX = "download it where the hub is reachable and pass the directory"


class HubError(ValueError):
    """A download that failed; str() is one line saying why and what to do."""


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0].removeprefix("Got: ")


def download(
    repo_id: str,
    local_dir: str | None = None,
    patterns: Sequence[str] = MODEL_FILES,
    *,
    what: str | None = None,
    offline_fix: str = OFFLINE_FIX,
) -> str:
    """The files of `repo_id` matching `patterns`, in the Hugging Face cache (or `local_dir`): their directory.
    `what` names the download in messages (default: the repository); `offline_fix` is what to do when the hub
    cannot be reached."""
    what = what or repo_id
    try:  # only hub ids need it (a directory does not): a missing one is one line, not an import error
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )
    except ImportError:
        raise HubError(
            f"downloading {what} needs huggingface_hub, which this Python does not have: pip install "
            f"huggingface_hub, or {offline_fix}"
        ) from None
    token = os.environ.get("HF_TOKEN") or None
    try:
        return snapshot_download(repo_id, token=token, local_dir=local_dir, allow_patterns=list(patterns))
    except GatedRepoError:
        fix = "export HF_TOKEN=<your token>" if token is None else "HF_TOKEN has no access yet"
        raise HubError(
            f"{repo_id} is gated on the Hugging Face hub: accept its license at "
            f"https://huggingface.co/{repo_id} ({fix})"
        ) from None
    except RepositoryNotFoundError:
        raise HubError(f"{what}: no such hub repository (or HF_TOKEN cannot see it)") from None
    except LocalEntryNotFoundError as err:  # what the hub client raises when it cannot reach the hub (or is offline)
        why = (
            "HF_HUB_OFFLINE is set"
            if constants.HF_HUB_OFFLINE
            else f"the Hugging Face hub ({constants.ENDPOINT}) cannot be reached from here"
        )
        raise HubError(
            f"downloading {what} failed: {why} and no copy is cached ({first_line(err)}); check the "
            f"network or the proxy (HTTPS_PROXY), or {offline_fix}"
        ) from None
    except (HfHubHTTPError, OSError) as err:
        raise HubError(f"downloading {what} failed: {first_line(err)}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="download a hub repository's weights, configs and tokenizer (HF_TOKEN)")
    fetch.add_argument("repo_id", help="e.g. meta-llama/Llama-3.1-8B")
    fetch.add_argument("--local-dir", help="download into this directory instead of the Hugging Face cache")
    fetch.add_argument("--tokenizer", action="store_true", help="the tokenizer's files only")
    fetch.add_argument("--prefix", default="error", help="what an error line starts with (default: error)")
    fetch.add_argument("--offline-fix", help="what an error says to do when the hub cannot be reached")
    args = parser.parse_args(argv)
    where = args.local_dir or "DIR"
    offline_fix = args.offline_fix or (
        f"fetch it where the hub is reachable (--local-dir {where}) and copy {where} here"
    )
    try:
        path = download(
            args.repo_id,
            args.local_dir,
            TOKENIZER_FILES if args.tokenizer else MODEL_FILES,
            what=f"the tokenizer {args.repo_id}" if args.tokenizer else args.repo_id,
            offline_fix=offline_fix,
        )
    except HubError as err:
        print(f"{args.prefix}: {err}", file=sys.stderr)
        return 1
    print(f"{args.repo_id} -> {path}")
    if not args.tokenizer:
        print(f"start a run from it with: {KEY}={path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
