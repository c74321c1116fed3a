"""The vocabulary every other package speaks: errors, wire structs, the catalog, configuration, SSE,
money, metrics and small types. It imports no other package of the project."""
