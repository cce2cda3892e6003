"""Writing megatron-core's .bin/.idx pair with numpy alone.

megatron-core's IndexedDatasetBuilder needs `import megatron.core`, which imports torch and the whole of
megatron-core (several seconds on every data preparation task, before the first token); what data preparation
writes (one sequence per document, no multimodal modes) is a few arrays. The bytes are the builder's: a test
compares them with its output, and `python -m data_prep verify` reads every shard back with megatron-core's
IndexedDataset, as training will.
"""

from __future__ import annotations

from typing import Union

import numpy as np

from data_prep.checks import INDEX_DTYPES, INDEX_HEADER, INDEX_MAGIC

_CODES = {name: code for code, (name, _) in INDEX_DTYPES.items()}


def optimal_dtype(vocab_size: int) -> type:
    """megatron-core's DType.optimal_dtype: uint16 when every token id fits, else int32."""
    return np.uint16 if vocab_size < 65500 else np.int32


class IndexWriter:
    """Tokens go to `bin_path` as they come; the index is written by finalize()."""

    def __init__(self, bin_path: str, dtype: Union[str, type]):
        self.dtype = np.dtype(dtype)
        self._lengths: list[np.ndarray] = []
        self.data_file = open(bin_path, "wb")

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Documents one after another: `tokens` concatenated, `lengths` tokens each."""
        self.data_file.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self._lengths.append(np.asarray(lengths, dtype=np.int64))

    def finalize(self, idx_path: str) -> None:
        self.data_file.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        pointers = np.zeros(len(lengths), np.int64)  # byte offset of each sequence in the .bin
        np.cumsum(lengths[:-1] * self.dtype.itemsize, out=pointers[1:])
        documents = np.arange(len(lengths) + 1, dtype=np.int64)  # one sequence per document
        with open(idx_path, "wb") as f:
            f.write(INDEX_HEADER.pack(INDEX_MAGIC, 1, _CODES[self.dtype.name], len(lengths), len(documents)))
            for array in (lengths.astype(np.int32), pointers, documents):
                f.write(array.tobytes())
