"""Generated gRPC stubs of proto/mutwo/v1 (generate_stubs.sh --package)."""
