"""Hugging Face Llama weights in (the import) and out (the export), and the name mapping between the two."""
