"""Parts of the test harness shared by several tiers: the images as built by `make images`, a
containerd of the test's own, an S3 API server."""
