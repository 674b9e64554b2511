"""Shows the record: Datasette plugin, metadata and the lifecycle checker."""
