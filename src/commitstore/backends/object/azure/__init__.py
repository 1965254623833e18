"""Azure Blob Storage (``az://``, ``abfs://``): Put Block List (or one Put Blob) is the commit;
``backend`` holds the strategy, ``errors`` the error translation."""
