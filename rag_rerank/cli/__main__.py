"""`python -m rag_rerank.cli`: the `rag-rerank` command."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
