"""``python -m llama_index_hyde_plus.cli``: the same as ``hyde-plus``."""

from .._entry import main

main()
