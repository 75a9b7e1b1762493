"""Tiered storage: per-queue chunks of flushed data kept in an object store (docs/tiered-storage.md).

``backend`` (where bytes go: a directory, S3), ``layout`` (chunk and manifest formats),
``catalog`` (what the tier holds, per queue), ``uploader`` (the store thread that moves data up),
``cold`` (reads served from the tier), ``service`` (the facade the store hooks into).
"""
