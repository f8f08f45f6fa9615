"""Framework components: drop-in rerankers for LangChain, LlamaIndex and Haystack, and batch
reranking on Ray Data (`rag_rerank.integrations.ray`, `rag-rerank[ray]`).

One module per framework, each behind its optional extra and imported only when asked for
(`rag_rerank.integrations.langchain` needs `rag-rerank[langchain]`, and so on), so importing
`rag_rerank` never pulls a framework in. Every component wraps `rerank` / `arerank`; none
re-implements the pipeline. What they share (option names, the id <-> item mapping, the
metadata keys) lives in `_common`.
"""
