"""Google Cloud Storage (``gs://``, ``gcs://``): a resumable upload's finalisation or one
whole-object put is the commit; ``backend`` holds the strategy, ``upload`` the upload session
and its resume, ``client`` the gcsfs session settings, ``errors`` the error translation."""
