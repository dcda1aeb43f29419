"""The runner: forward passes over the KV cache, sequences, the batch loop."""
