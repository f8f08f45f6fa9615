"""A fixed query and texts whose token ids, vectors and scores the tests pin (see test_embed_static)."""

PIN_QUERY = "Why does my Kubernetes pod keep restarting with OOMKilled?"
PIN_TEXTS = [
    "kubectl logs --previous shows why the last container instance exited (exit code 137: OOMKilled).",
    "Raise the memory limit in the pod spec; the kubelet kills a container that exceeds it.",
    "naïve Ünïcode — “quotes” 東京タワー 123,456.78 e-mail ΟΔΟΣ Σ\u2028line\u2029para",
    "Fold the egg whites gently into the batter and bake for 40 minutes.",
    "\x00ctrl\u200bzero\tTab\r\nnewline Straße ﬁne ½ ㎏ İstanbul 🙂 café",
    "",
]
