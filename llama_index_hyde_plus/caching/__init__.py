"""Transform caches (memory, SQLite, LlamaIndex KVStores) and the cache key."""
