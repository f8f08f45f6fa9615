"""Test helpers that are real parts, not mocks: a local HTTP server speaking the LLM wire formats."""
