"""`make bench-peer`: Muster and dstack 0.22.5 side by side on the same workloads (bench/peer/README.md)."""
