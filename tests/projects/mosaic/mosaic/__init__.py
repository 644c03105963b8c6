"""mosaic: a three-stage test project whose stage modules return their outputs the way library
models do (an output class, a dict, a tuple), with no wrapper; its photo encoder does not depend on
the bucket, so compile builds it once for both buckets."""
