"""The DuckDB warehouse: `store` (`Warehouse`, the one way to open, read and write the file),
`sources` (how one source's questions are written and re-keyed) and `schema.sql` (its tables)."""
