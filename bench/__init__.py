"""parrecio benchmarks (see bench/README.md)."""
