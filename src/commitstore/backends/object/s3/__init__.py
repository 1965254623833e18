"""S3 and S3-compatible stores (``s3://``): multipart completion or one whole-object put is the
commit; ``backend`` holds the strategy, the other modules its listing, ranged reads, uploads,
error translation and timestamps."""
