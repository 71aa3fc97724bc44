"""Control-plane benchmarks and fault injection (`make bench`, `make chaos`); never part of `make test`."""
