"""What a run leaves behind for people: metrics.jsonl, TensorBoard event files, the curves PNG."""
