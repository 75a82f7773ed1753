"""The search: `TransformRetriever`, its plan, fusion, expansion and document vectors."""
