"""still: an image -> video toy (a photo that sways in colour over time), released through the pipeline contract."""
