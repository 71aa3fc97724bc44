"""The dstack layer's rules: its error format, ids, per-user keys, the spec translator and renderers."""
