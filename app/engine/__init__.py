"""The LLM engine: loading, tokenisation, batched generation with attention capture."""
