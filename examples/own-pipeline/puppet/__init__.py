"""puppet: a two-stage talking-head toy (motion -> decode), released through avatar-release's
pipeline contract. The toolchain knows it only through ``puppet.release:pipeline``."""
