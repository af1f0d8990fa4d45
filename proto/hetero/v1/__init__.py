"""Generated gRPC/protobuf modules of the hetero.v1 API (see proto/hetero/v1/*.proto)."""
