"""`python -m rag_rerank ...`: the same command line as the `rag-rerank` script."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
