"""Data: the benchmark registry and prompt templates, and the embedded tasks (arithmetic,
guessable items) with their generators and tiny models."""
