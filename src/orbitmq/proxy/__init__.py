"""The gRPC proxy that speaks the Apache RocketMQ 5 client protocol."""
